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
	// Wait is how long a tick waits for the GPUs' reads (0: DefaultWait). A read not done
	// by then does not hold the others' samples back: its sample goes out at a later tick.
	Wait time.Duration
}

// DefaultWait is Options.Wait's default: a GPU answers its dozen NVML calls in
// milliseconds; one that takes longer is hung or failing.
const DefaultWait = 250 * time.Millisecond

// closeWait bounds how long Close waits for reads still in NVML before shutting it down.
const closeWait = 2 * time.Second

// Source samples every GPU NVML lists. Sample and Late are called by one goroutine (the
// ticker); Run reads PCIe throughput beside it. Each GPU is read on a goroutine of its own,
// at most one at a time per GPU, so a GPU whose NVML calls hang (one falling off the bus,
// an XID storm, a driver stuck) holds back neither the other GPUs nor the tick: NVML is
// thread-safe, and go-nvml calls it without a lock of its own.
type Source struct {
	lib    library
	opts   Options
	gpus   []*gpu
	m      *metrics
	logger *slog.Logger

	// done carries finished reads to the ticker. It has room for one per GPU, and a GPU has
	// at most one read outstanding (the ticker starts the next only once it has the last
	// one's result), so a read never blocks on it.
	done  chan readResult
	reads sync.WaitGroup     // reads in NVML (and the PCIe loops), for Close
	late  []events.GPUSample // reads of earlier ticks finished at this one, for Late
	timer *time.Timer

	closeOnce sync.Once
}

// readResult is one finished read of a GPU, for the tick it was begun at.
type readResult struct {
	g    *gpu
	tick time.Time
	took time.Duration
	smp  events.GPUSample
}

type gpu struct {
	index  int
	label  string // index as a metric label
	uuid   string
	name   string
	dev    nvml.Device
	state  [numFields]fieldState
	nvlink nvlinkState

	// the ticker's only
	reading  bool      // a read is outstanding
	readTick time.Time // the tick it was begun at
	awaited  bool      // the tick waits for it
	slow     bool      // the last read took longer than the wait: no tick waits for the next
	fresh    events.GPUSample
	hasFresh bool      // fresh is this tick's sample
	lag      string    // "" or the reason the GPU's samples lag (logged when it begins)
	lagBusy  bool      // the lag has been logged as an earlier tick's read still running
	lagSince time.Time // the first tick of the lag

	mu      sync.Mutex // guards the PCIe readings, written by pcieLoop
	pcieTx  *float64
	pcieRx  *float64
	pcieAt  time.Time
	pcieGot bool
}

// fieldState is what the source has learned about one reading of one GPU. Each field's
// state is touched by one goroutine at a time: the GPU's read for most (one outstanding,
// handed on through done and the ticker), pcieLoop for PCIe.
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
	if opts.Wait <= 0 {
		opts.Wait = DefaultWait
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
	s.m = newMetrics(reg, s.gpus)
	s.done = make(chan readResult, len(s.gpus))
	for _, g := range s.gpus {
		logger.Info("sampling GPU", "gpu", g.index, "uuid", g.uuid, "name", g.name)
	}
	return s, nil
}

// GPUs returns how many GPUs the source samples.
func (s *Source) GPUs() int { return len(s.gpus) }

// Sample appends one sample per GPU to dst, taken now, and returns it. Readings that are
// unsupported or fail are nil; the samples carry no host, version or time (the caller's).
//
// Each GPU not still reading is read on its own goroutine, and Sample waits for those reads
// up to Options.Wait, not for a GPU whose last read took longer than that. A GPU whose
// read is not done then has no sample here: it comes from Late at the first tick after it
// finishes, with this tick's time. A GPU still reading at an earlier tick's read is not
// read again (at most one read per GPU is ever outstanding, however long NVML hangs): its
// sample of this tick has no readings, as when every reading fails.
func (s *Source) Sample(_ context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample {
	s.late = s.late[:0]
	s.collect(now)
	awaited := 0
	for _, g := range s.gpus {
		g.hasFresh = false
		if g.reading {
			continue
		}
		g.reading, g.readTick, g.awaited = true, now, !g.slow
		if g.awaited {
			awaited++
		}
		s.reads.Add(1)
		go s.readGPU(g, now)
	}
	s.await(now, awaited)
	for _, g := range s.gpus {
		switch {
		case g.hasFresh:
			dst = append(dst, g.fresh)
			s.caughtUp(g, now)
		case g.readTick.Equal(now):
			s.m.lagging.WithLabelValues(g.label, lagLate).Inc()
			s.lagging(g, lagLate, now)
		default:
			dst = append(dst, events.GPUSample{GPUIndex: g.index, GPUUUID: g.uuid, GPUName: g.name, Source: events.SourceNVML})
			s.m.lagging.WithLabelValues(g.label, lagBusy).Inc()
			s.lagging(g, lagBusy, now)
		}
	}
	return dst
}

// Late appends the samples of reads begun at earlier ticks that finished by this one's
// Sample, each with the time of the tick it was begun at, and returns dst. Call it after
// Sample, at every tick: the next Sample forgets what it did not take.
func (s *Source) Late(dst []events.GPUSample) []events.GPUSample {
	return append(dst, s.late...)
}

// Reasons a GPU's samples lag, the values of the lagging metric's reason label.
const (
	lagLate = "late" // the tick's read was not done in time: its sample goes out at a later tick
	lagBusy = "busy" // an earlier tick's read was still running: the tick's sample has no readings
)

// readGPU reads every reading of g but PCIe for the tick now, and hands the sample to the
// ticker.
func (s *Source) readGPU(g *gpu, now time.Time) {
	defer s.reads.Done()
	began := time.Now()
	r := readResult{g: g, tick: now,
		smp: events.GPUSample{GPUIndex: g.index, GPUUUID: g.uuid, GPUName: g.name, Source: events.SourceNVML}}
	for f := range fieldPCIeTx {
		s.read(g, f, now, &r.smp)
	}
	g.takePCIe(&r.smp, now, 3*s.opts.PCIeInterval)
	r.took = time.Since(began)
	s.done <- r
}

// collect takes the reads finished since the last tick, without waiting.
func (s *Source) collect(now time.Time) {
	for {
		select {
		case r := <-s.done:
			s.receive(r, now)
		default:
			return
		}
	}
}

// await takes finished reads until the n reads begun at now that the tick waits for are
// in or Options.Wait has passed. Not less at shutdown: the reads are under way, and a
// sample not in by the last tick would be late with no later tick to publish it.
func (s *Source) await(now time.Time, n int) {
	if n == 0 {
		return
	}
	if s.timer == nil {
		s.timer = time.NewTimer(s.opts.Wait)
	} else {
		s.timer.Reset(s.opts.Wait)
	}
	defer s.timer.Stop()
	for n > 0 {
		select {
		case r := <-s.done:
			if r.tick.Equal(now) && r.g.awaited {
				n--
			}
			s.receive(r, now)
		case <-s.timer.C:
			return
		}
	}
}

// receive records a finished read: this tick's sample, or a late one with its own tick's
// time.
func (s *Source) receive(r readResult, now time.Time) {
	g := r.g
	g.reading = false
	g.slow = r.took > s.opts.Wait
	s.m.readDuration.Observe(r.took.Seconds())
	if r.tick.Equal(now) {
		g.fresh, g.hasFresh = r.smp, true
		return
	}
	r.smp.TS = r.tick
	s.late = append(s.late, r.smp)
}

// lagging logs that g's samples lag when it begins, and once more if an earlier tick's
// read is still running: a GPU that hangs for minutes is logged twice, not at every tick.
func (s *Source) lagging(g *gpu, reason string, now time.Time) {
	switch {
	case g.lag == "":
		g.lag, g.lagSince, g.lagBusy = reason, now, reason == lagBusy
		if reason == lagBusy {
			s.logger.Warn("GPU read still running from an earlier tick; its samples carry no readings until it answers, the other GPUs' go on",
				"gpu", g.index, "since", g.readTick)
			return
		}
		s.logger.Warn("GPU read not done in time; its sample goes out at a later tick, the other GPUs' go on",
			"gpu", g.index, "wait", s.opts.Wait)
	case reason == lagBusy && !g.lagBusy:
		g.lagBusy = true
		s.logger.Warn("GPU read still running from an earlier tick; its samples carry no readings until it answers, the other GPUs' go on",
			"gpu", g.index, "since", g.readTick)
	}
}

// caughtUp logs that g's samples are on time again after a lag.
func (s *Source) caughtUp(g *gpu, now time.Time) {
	if g.lag == "" {
		return
	}
	s.logger.Info("GPU read in time again", "gpu", g.index, "lagged", now.Sub(g.lagSince))
	g.lag, g.lagBusy = "", false
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
// the 20 ms NVML spends in each read never delays a tick. It returns when ctx ends, without
// waiting for a PCIe read stuck in NVML (a GPU that hangs): Close waits for those.
func (s *Source) Run(ctx context.Context) error {
	if s.opts.PCIeInterval > 0 {
		for _, g := range s.gpus {
			s.reads.Go(func() { s.pcieLoop(ctx, g) })
		}
	}
	<-ctx.Done()
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

// Close shuts NVML down; it is safe to call twice. Call it after Run has returned and the
// ticker has stopped. A read still in NVML (a GPU that hangs, the tick's or PCIe's) is
// waited for up to closeWait; past it NVML is left as it is, for shutting it down under a
// call in flight is not safe, and the process ending releases it.
func (s *Source) Close() error {
	var err error
	s.closeOnce.Do(func() {
		idle := make(chan struct{})
		go func() {
			s.reads.Wait()
			close(idle)
		}()
		select {
		case <-idle:
		case <-time.After(closeWait):
			err = fmt.Errorf("cannot shut NVML down: GPU reads still running after %s", closeWait)
			return
		}
		if ret := s.lib.Shutdown(); ret != nvml.SUCCESS {
			err = fmt.Errorf("cannot shut NVML down: %s", codeName(ret))
		}
	})
	return err
}
