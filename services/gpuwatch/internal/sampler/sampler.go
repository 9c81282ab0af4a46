package sampler

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// source gives one sample per GPU taken at now, appended to dst. Host, version and time
// are the sampler's to set.
type source interface {
	Sample(ctx context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample
}

// publisher queues a message without blocking; bus.Publisher is one.
type publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// exporter shows the latest samples on /metrics.
type exporter interface {
	Update(samples []events.GPUSample)
}

// hostReader reads the host itself (memory, disks, network) at a tick; version, time and
// host are the sampler's to set.
type hostReader interface {
	Read(now time.Time) events.HostSample
}

// Options configure a Sampler.
type Options struct {
	Host     string
	Interval time.Duration
	// HostReader, when set, is read on every tick and its sample published on
	// host.sample.<host> beside the GPU samples of the same tick.
	HostReader hostReader
}

// Sampler is gpuwatch's tick loop.
type Sampler struct {
	src         source
	pub         publisher
	exp         exporter
	opts        Options
	subject     string
	hostSubject string
	m           *metrics
	logger      *slog.Logger

	buf      []events.GPUSample
	valid    []events.GPUSample
	data     []byte
	id       []byte
	lastTick atomic.Int64 // unix nanoseconds of the last finished tick
	lastErr  string       // reason of the last invalid sample, to log only changes
	hostErr  string       // likewise for host samples
}

// New returns a Sampler of src that publishes through pub and shows samples through exp.
func New(src source, pub publisher, exp exporter, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Sampler {
	return &Sampler{
		src: src, pub: pub, exp: exp, opts: opts,
		subject:     events.GPUSampleSubject(opts.Host),
		hostSubject: events.HostSampleSubject(opts.Host),
		m:           newMetrics(reg),
		logger:      logger,
	}
}

// Run ticks until ctx ends. Ticks fall on wall-clock multiples of the interval; a tick
// that overruns the next one skips it (and counts it) instead of piling up.
func (s *Sampler) Run(ctx context.Context) error {
	next := nextTick(time.Now(), s.opts.Interval)
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case woke := <-timer.C:
			s.m.lateness.Observe(max(woke.Sub(next), 0).Seconds())
		}
		s.Tick(ctx, next)
		after := nextTick(time.Now(), s.opts.Interval)
		if missed := int(after.Sub(next)/s.opts.Interval) - 1; missed > 0 {
			s.m.skipped.Add(float64(missed))
		}
		next = after
		timer.Reset(time.Until(next))
	}
}

// nextTick returns the first multiple of d after t.
func nextTick(t time.Time, d time.Duration) time.Time { return t.Truncate(d).Add(d) }

// Tick samples every GPU at now and queues the samples for publishing.
func (s *Sampler) Tick(ctx context.Context, now time.Time) {
	began := time.Now()
	now = now.UTC()
	s.buf = s.src.Sample(ctx, now, s.buf[:0])
	s.valid = s.valid[:0]
	for i := range s.buf {
		smp := &s.buf[i]
		smp.V, smp.TS, smp.Host = events.Version, now, s.opts.Host
		if err := smp.ValidateAt(now); err != nil {
			reason := events.Reason(err)
			s.m.invalid.WithLabelValues(reason).Inc()
			if msg := err.Error(); msg != s.lastErr {
				s.logger.Warn("GPU sample breaks the contract; not published", "gpu", smp.GPUIndex, "err", err)
				s.lastErr = msg
			}
			continue
		}
		s.data = appendSample(s.data[:0], smp)
		s.id = appendMsgID(s.id[:0], smp)
		// Publish keeps data: it must be a copy, the buffer is reused.
		if s.pub.Publish(s.subject, string(s.id), append([]byte(nil), s.data...)) {
			s.m.samples.Inc()
		}
		s.valid = append(s.valid, *smp)
	}
	s.exp.Update(s.valid)
	if s.opts.HostReader != nil {
		s.publishHost(now)
	}
	s.m.gpus.Set(float64(len(s.valid)))
	s.m.ticks.Inc()
	s.m.duration.Observe(time.Since(began).Seconds())
	s.lastTick.Store(time.Now().UnixNano())
}

// publishHost reads the host at now and queues its sample.
func (s *Sampler) publishHost(now time.Time) {
	smp := s.opts.HostReader.Read(now)
	smp.V, smp.TS, smp.Host = events.Version, now, s.opts.Host
	err := smp.ValidateAt(now)
	var data []byte
	if err == nil {
		data, err = events.MarshalHostSample(&smp)
	}
	if err != nil {
		s.m.hostInvalid.WithLabelValues(events.Reason(err)).Inc()
		if msg := err.Error(); msg != s.hostErr {
			s.logger.Warn("host sample breaks the contract; not published", "err", err)
			s.hostErr = msg
		}
		return
	}
	id := events.AppendTime(append(append([]byte(nil), s.opts.Host...), "/host/"...), now)
	if s.pub.Publish(s.hostSubject, string(id), data) {
		s.m.hostSamples.Inc()
	}
}

// LastTick returns when the last tick finished, or the zero time before the first.
func (s *Sampler) LastTick() time.Time {
	ns := s.lastTick.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
