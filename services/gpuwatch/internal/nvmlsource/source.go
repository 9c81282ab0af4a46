package nvmlsource

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// library is the part of NVML the source needs once it is initialised; nvml.Interface and
// go-nvml's mock servers have it.
type library interface {
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return)
	Shutdown() nvml.Return
}

// Options tune a Source.
type Options struct {
	// PCIeInterval is how often each GPU's PCIe throughput is read; 0 reads none.
	PCIeInterval time.Duration
	// Recheck is how long an unsupported reading is skipped before it is tried again.
	Recheck time.Duration
}

// Source samples every GPU NVML lists. Sample is called by one goroutine (the ticker); Run
// reads PCIe throughput beside it.
type Source struct {
	lib    library
	opts   Options
	gpus   []*gpu
	m      *metrics
	logger *slog.Logger

	closeOnce sync.Once
}

type gpu struct {
	index  int
	label  string // index as a metric label
	uuid   string
	name   string
	dev    nvml.Device
	state  [numFields]fieldState
	nvlink nvlinkState

	mu      sync.Mutex // guards the PCIe readings, written by pcieLoop
	pcieTx  *float64
	pcieRx  *float64
	pcieAt  time.Time
	pcieGot bool
}

// fieldState is what the source has learned about one reading of one GPU. Each field's
// state is touched by one goroutine only: the tick for most, pcieLoop for PCIe.
type fieldState struct {
	retryAt  time.Time   // while unsupported: when to try again
	known    bool        // tried at least once
	support  bool        // last try said supported
	lastFail nvml.Return // last failure code, to log a failure only when it changes
}

// New lists the GPUs of lib, which Load initialised. A GPU whose handle or UUID cannot be
// read is left out and logged: a sample without a UUID would break the contract. It fails
// only when NVML cannot count the GPUs or none is usable.
func New(lib library, opts Options, reg prometheus.Registerer, logger *slog.Logger) (*Source, error) {
	if opts.Recheck <= 0 {
		opts.Recheck = 5 * time.Minute
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("cannot count GPUs through NVML: %s", codeName(ret))
	}
	s := &Source{lib: lib, opts: opts, logger: logger}
	for i := range n {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			logger.Error("cannot open GPU; leaving it out", "gpu", i, "err", codeName(ret))
			continue
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS || uuid == "" {
			logger.Error("cannot read GPU UUID; leaving it out", "gpu", i, "err", codeName(ret))
			continue
		}
		name, ret := d.GetName()
		if ret != nvml.SUCCESS {
			name = "" // optional in the contract
		}
		s.gpus = append(s.gpus, &gpu{index: i, label: strconv.Itoa(i), uuid: uuid, name: name, dev: d})
	}
	if len(s.gpus) == 0 {
		return nil, fmt.Errorf("NVML lists %d GPUs and none can be read", n)
	}
	s.m = newMetrics(reg, len(s.gpus))
	for _, g := range s.gpus {
		logger.Info("sampling GPU", "gpu", g.index, "uuid", g.uuid, "name", g.name)
	}
	return s, nil
}

// GPUs returns how many GPUs the source samples.
func (s *Source) GPUs() int { return len(s.gpus) }

// Sample appends one sample per GPU to dst, taken now, and returns it. Readings that are
// unsupported or fail are nil; the samples carry no host, version or time (the caller's).
func (s *Source) Sample(_ context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample {
	for _, g := range s.gpus {
		dst = append(dst, events.GPUSample{GPUIndex: g.index, GPUUUID: g.uuid, GPUName: g.name, Source: events.SourceNVML})
		smp := &dst[len(dst)-1]
		for f := range fieldPCIeTx {
			s.read(g, f, now, smp)
		}
		g.takePCIe(smp, now, 3*s.opts.PCIeInterval)
	}
	return dst
}

// read takes one reading unless it is known unsupported and not yet due for a re-check.
func (s *Source) read(g *gpu, f field, now time.Time, smp *events.GPUSample) {
	st := &g.state[f]
	if !st.retryAt.IsZero() && now.Before(st.retryAt) {
		return
	}
	var ret nvml.Return
	if f == fieldNVLink {
		ret = s.readNVLink(g, now, smp)
	} else {
		ret = readField(g.dev, f, smp)
	}
	switch {
	case ret == nvml.SUCCESS:
		st.retryAt = time.Time{}
		st.lastFail = nvml.SUCCESS
		s.setSupport(g, f, st, true, ret)
	case unsupported(ret):
		st.retryAt = now.Add(s.opts.Recheck)
		s.setSupport(g, f, st, false, ret)
	default:
		s.m.readErrors.WithLabelValues(fields[f].Name, codeName(ret)).Inc()
		if ret != st.lastFail {
			s.logger.Warn("GPU reading failed; leaving it out of samples until it answers",
				"gpu", g.index, "reading", fields[f].Name, "err", codeName(ret))
			st.lastFail = ret
		}
	}
}

func (s *Source) setSupport(g *gpu, f field, st *fieldState, ok bool, ret nvml.Return) {
	if st.known && st.support == ok {
		return
	}
	v := 0.0
	if ok {
		v = 1
	}
	s.m.supported.WithLabelValues(g.label, fields[f].Name).Set(v)
	switch {
	case ok && st.known:
		s.logger.Info("GPU reading is supported again", "gpu", g.index, "reading", fields[f].Name)
	case !ok:
		s.logger.Info("GPU reading not supported; it is left out of samples and re-checked later",
			"gpu", g.index, "reading", fields[f].Name, "code", codeName(ret), "recheck", s.opts.Recheck)
	}
	st.known, st.support = true, ok
}

// Run reads PCIe throughput of every GPU until ctx ends, each GPU on its own goroutine, so
// the 20 ms NVML spends in each read never delays a tick.
func (s *Source) Run(ctx context.Context) error {
	if s.opts.PCIeInterval <= 0 {
		<-ctx.Done()
		return nil
	}
	var wg sync.WaitGroup
	for _, g := range s.gpus {
		wg.Go(func() { s.pcieLoop(ctx, g) })
	}
	wg.Wait()
	return nil
}

func (s *Source) pcieLoop(ctx context.Context, g *gpu) {
	t := time.NewTicker(s.opts.PCIeInterval)
	defer t.Stop()
	for {
		var smp events.GPUSample
		now := time.Now()
		s.read(g, fieldPCIeTx, now, &smp)
		s.read(g, fieldPCIeRx, now, &smp)
		g.mu.Lock()
		g.pcieTx, g.pcieRx, g.pcieAt, g.pcieGot = smp.PCIeTxBps, smp.PCIeRxBps, time.Now(), true
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// takePCIe copies the latest PCIe readings into smp when they are younger than maxAge.
func (g *gpu) takePCIe(smp *events.GPUSample, now time.Time, maxAge time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.pcieGot || now.Sub(g.pcieAt) > maxAge {
		return
	}
	smp.PCIeTxBps, smp.PCIeRxBps = g.pcieTx, g.pcieRx
}

// Close shuts NVML down; it is safe to call twice. Call it after Run has returned.
func (s *Source) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
			err = fmt.Errorf("cannot shut NVML down: %s", codeName(ret))
		}
	})
	return err
}
