package sampler

import (
	"context"
	"errors"
	"log/slog"
	"slices"
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

// lateSource is a source whose reads of a GPU can outlast their tick (NVML, on a GPU that
// hangs): Late appends the samples of such reads finished since the last tick, each with the
// time of the tick it was read for.
type lateSource interface {
	Late(dst []events.GPUSample) []events.GPUSample
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
	late     []events.GPUSample
	valid    []events.GPUSample
	shown    []events.GPUSample
	data     []byte
	id       []byte
	energy   map[string]energyReading // per GPU UUID: its last published energy counter
	lastTick atomic.Int64             // unix nanoseconds of the last finished tick
	// per GPU and field, why its reading or sample broke the contract at the last tick and
	// at this one: logged when it starts or changes, not at every tick
	logged, logging map[string]string
	hostErr         string // the last error of a host sample or reading, to log only changes
}

// New returns a Sampler of src that publishes through pub and shows samples through exp.
func New(src source, pub publisher, exp exporter, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Sampler {
	return &Sampler{
		src: src, pub: pub, exp: exp, opts: opts,
		subject:     events.GPUSampleSubject(opts.Host),
		hostSubject: events.HostSampleSubject(opts.Host),
		m:           newMetrics(reg),
		logger:      logger,
		energy:      map[string]energyReading{},
		logged:      map[string]string{},
		logging:     map[string]string{},
	}
}

// energyReading is a GPU's energy counter in its last published sample.
type energyReading struct {
	ts     int64 // unix nanoseconds
	energy float64
}

// energyHorizon is how long a GPU's last counter reading is kept without a new sample.
const energyHorizon = int64(time.Hour)

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

// Tick samples every GPU at now and queues the samples for publishing, after those of
// earlier ticks whose reads finished since (a source that has them), with their own time.
func (s *Sampler) Tick(ctx context.Context, now time.Time) {
	began := time.Now()
	now = now.UTC()
	s.buf = s.src.Sample(ctx, now, s.buf[:0])
	s.late = s.late[:0]
	if ls, ok := s.src.(lateSource); ok {
		s.late = ls.Late(s.late)
	}
	s.valid = s.valid[:0]
	s.forgetEnergy(now)
	// The late first: they are older, and a GPU's energy delta runs from its older sample.
	for i := range s.late {
		s.queue(&s.late[i], s.late[i].TS.UTC(), now)
	}
	late := len(s.valid)
	for i := range s.buf {
		s.queue(&s.buf[i], now, now)
	}
	s.logged, s.logging = s.logging, s.logged // what broke at this tick is what the next compares with
	clear(s.logging)
	s.exp.Update(s.latest(late))
	if s.opts.HostReader != nil {
		s.publishHost(now)
	}
	s.m.gpus.Set(float64(len(s.shown)))
	s.m.ticks.Inc()
	s.m.duration.Observe(time.Since(began).Seconds())
	s.lastTick.Store(time.Now().UnixNano())
}

// queue checks smp, taken at ts, and queues it for publishing; a valid one is kept in
// s.valid.
func (s *Sampler) queue(smp *events.GPUSample, ts, now time.Time) {
	smp.V, smp.TS, smp.Host = events.Version, ts, s.opts.Host
	smp.EnergyUsedJ = nil // the sampler's to set, from the counter's delta
	// A bad reading (a driver's glitch) is left out, not the GPU's sample with it.
	dropped, err := events.DropBadReadings(smp, now)
	for _, derr := range dropped {
		reason := events.Reason(derr)
		s.m.dropped.WithLabelValues(reason).Inc()
		if s.changed(smp, derr, reason) {
			s.logger.Warn("GPU reading breaks the contract; left out of the sample", "gpu", smp.GPUIndex, "err", derr)
		}
	}
	if err != nil {
		reason := events.Reason(err)
		s.m.invalid.WithLabelValues(reason).Inc()
		if s.changed(smp, err, reason) {
			s.logger.Warn("GPU sample breaks the contract; not published", "gpu", smp.GPUIndex, "err", err)
		}
		return
	}
	s.setEnergyUsed(smp)
	s.data = appendSample(s.data[:0], smp)
	s.id = appendMsgID(s.id[:0], smp)
	// Publish keeps data: it must be a copy, the buffer is reused.
	if s.pub.Publish(s.subject, string(s.id), append([]byte(nil), s.data...)) {
		s.m.samples.Inc()
		s.recordEnergy(smp)
	}
	s.valid = append(s.valid, *smp)
}

// latest returns the newest valid sample of each GPU of this tick: its sample of the tick,
// or else a late one. s.valid holds the late samples first, then the tick's.
func (s *Sampler) latest(late int) []events.GPUSample {
	s.shown = append(s.shown[:0], s.valid[late:]...)
	for _, l := range s.valid[:late] {
		if !slices.ContainsFunc(s.shown, func(t events.GPUSample) bool { return t.GPUUUID == l.GPUUUID }) {
			s.shown = append(s.shown, l)
		}
	}
	return s.shown
}

// changed records that err (with its reason) broke smp's GPU's field at this tick and
// reports whether that is news: the field was fine at the previous tick, or broke for
// another reason. The error's text is not compared: it holds the value, which a sick
// sensor changes at every tick.
func (s *Sampler) changed(smp *events.GPUSample, err error, reason string) bool {
	field := ""
	if fe, ok := errors.AsType[*events.FieldError](err); ok {
		field = fe.Field
	}
	key := smp.GPUUUID + "\x00" + field
	s.logging[key] = reason
	return s.logged[key] != reason
}

// setEnergyUsed sets the energy the GPU used since its last published sample that carried the
// energy counter: the counter's delta, absent on the GPU's first such sample, after a counter
// reset, on a sample without the counter, and when the delta is beyond the contract's bound.
// A sample that could not be queued is not a previous sample: the next one's delta spans it,
// so its energy is not lost.
func (s *Sampler) setEnergyUsed(smp *events.GPUSample) {
	prev, ok := s.energy[smp.GPUUUID]
	if !ok || smp.EnergyJ == nil || smp.TS.UnixNano() <= prev.ts {
		return
	}
	if d := *smp.EnergyJ - prev.energy; d >= 0 && d <= events.MaxEnergyUsedJ {
		smp.EnergyUsedJ = &d
	}
}

// recordEnergy keeps the published sample's counter as its GPU's previous reading; a sample
// without the counter (a failed read) keeps the one before, so the next delta spans it.
func (s *Sampler) recordEnergy(smp *events.GPUSample) {
	if smp.EnergyJ == nil {
		return
	}
	if prev, ok := s.energy[smp.GPUUUID]; ok && smp.TS.UnixNano() <= prev.ts {
		return // an older sample than the one the next delta runs from
	}
	s.energy[smp.GPUUUID] = energyReading{ts: smp.TS.UnixNano(), energy: *smp.EnergyJ}
}

// forgetEnergy drops the readings of GPUs unpublished for energyHorizon, so GPUs that come and
// go do not grow the map and a GPU back after that long starts afresh.
func (s *Sampler) forgetEnergy(now time.Time) {
	horizon := now.UnixNano() - energyHorizon
	for k, r := range s.energy {
		if r.ts < horizon {
			delete(s.energy, k)
		}
	}
}

// publishHost reads the host at now and queues its sample.
func (s *Sampler) publishHost(now time.Time) {
	smp := s.opts.HostReader.Read(now)
	smp.V, smp.TS, smp.Host = events.Version, now, s.opts.Host
	dropped, err := events.DropBadReadings(&smp, now)
	for _, derr := range dropped {
		s.m.dropped.WithLabelValues(events.Reason(derr)).Inc()
		if msg := derr.Error(); msg != s.hostErr {
			s.logger.Warn("host reading breaks the contract; left out of the sample", "err", derr)
			s.hostErr = msg
		}
	}
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
