package pipeline

import (
	"context"
	"strconv"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// The sample pipelines (GPU, engine, host) are one pipeline, sampleStage, run on three
// kinds of sample; what differs between them is below.

// NewGPU returns the pipeline from GPU_SAMPLES to gpu_rollups; see NewTokens.
func NewGPU(ctx context.Context, o Options, cfg window.Config, d Deps) (*Pipeline, error) {
	return newSamplePipeline(ctx, o, cfg, d, sampleKind[events.GPUSample, events.GPURollup, *window.GPUAggregator]{
		stream: "gpu", table: "gpu_rollups", queryID: "-gpu-",
		newAgg:     window.NewGPU,
		decode:     events.UnmarshalGPUSample,
		validate:   (*events.GPUSample).ValidateAt,
		write:      (*sink.ClickHouse).WriteGPURollups,
		subject:    func(r *events.GPURollup) string { return events.GPURollupSubject(r.Host) },
		windowOf:   func(r *events.GPURollup) (time.Time, string) { return r.WindowStart, r.Kind },
		keyWeight:  1,
		watermark:  true,
		forgetIdle: (*window.GPUAggregator).ForgetIdle,
	})
}

// engineKeyWeight is how many buffered request events one held engine key counts for in
// the memory bound: a key holds four histograms of up to 129 buckets.
const engineKeyWeight = 10

// NewEngine returns the pipeline from ENGINE_SAMPLES to engine_rollups; see NewTokens.
func NewEngine(ctx context.Context, o Options, cfg window.Config, d Deps) (*Pipeline, error) {
	return newSamplePipeline(ctx, o, cfg, d, sampleKind[events.EngineSample, events.EngineRollup, *window.EngineAggregator]{
		stream: "engine", table: "engine_rollups", queryID: "-engine-",
		newAgg:    window.NewEngine,
		decode:    events.UnmarshalEngineSample,
		validate:  (*events.EngineSample).ValidateAt,
		write:     (*sink.ClickHouse).WriteEngineRollups,
		subject:   func(r *events.EngineRollup) string { return events.EngineRollupSubject(r.Host) },
		windowOf:  func(r *events.EngineRollup) (time.Time, string) { return r.WindowStart, r.Kind },
		keyWeight: engineKeyWeight,
		watermark: true, // engine alerts and the TTFT alert's engine cause read these rollups
	})
}

// NewHost returns the pipeline from HOST_SAMPLES to host_rollups; see NewTokens.
func NewHost(ctx context.Context, o Options, cfg window.Config, d Deps) (*Pipeline, error) {
	return newSamplePipeline(ctx, o, cfg, d, sampleKind[events.HostSample, events.HostRollup, *window.HostAggregator]{
		stream: "host", table: "host_rollups", queryID: "-host-",
		newAgg:    window.NewHost,
		decode:    events.UnmarshalHostSample,
		validate:  (*events.HostSample).ValidateAt,
		write:     (*sink.ClickHouse).WriteHostRollups,
		subject:   func(r *events.HostRollup) string { return events.HostRollupSubject(r.Host) },
		windowOf:  func(r *events.HostRollup) (time.Time, string) { return r.WindowStart, r.Kind },
		keyWeight: 1,
		// No part in the watermark: no alert rule reads host rollups (the alerter
		// acknowledges rollup.host.* unread, as not_evaluated), so no window need wait for
		// them, and a lagging host pipeline must not hold back alerts on requests and GPUs.
		watermark: false,
	})
}

// sampleKind is what one kind of sample pipeline brings: samples S, rolled up by a window
// aggregator A into rows R.
type sampleKind[S, R, A any] struct {
	stream  string // the metrics' stream label
	table   string // the rollups' table, whose ledger is read at start
	queryID string // a write's ClickHouse query id is <flush id><queryID><attempt>

	newAgg   func(cfg window.Config, done map[time.Time]uint64) A
	decode   func(data []byte, s *S) error // does not validate
	validate func(s *S, now time.Time) error
	write    func(sk *sink.ClickHouse, ctx context.Context, rows []R, l sink.Ledger, now time.Time) error
	subject  func(r *R) string                         // where a stored row is published
	windowOf func(r *R) (start time.Time, kind string) // kind: events.KindWindow or KindCorrection

	keyWeight  int                      // buffered events one held key counts for in the memory bound
	watermark  bool                     // closed windows move the published watermark (see closedThrough)
	forgetIdle func(a A, now time.Time) // nil, or called on each observe to let idle keys go
}

// sampleAggregator is what a sample pipeline uses of its window aggregator (window.GPUAggregator,
// EngineAggregator, HostAggregator): samples S in, units of keys K and stats V, rows R out.
type sampleAggregator[S any, K comparable, V, R any] interface {
	Add(s *S, seq uint64, now time.Time) window.Result
	Advance(now time.Time) []*window.Unit[K, V]
	Rollups(u *window.Unit[K, V], dst []R) []R
	Release(u *window.Unit[K, V])
	Flushed(starts []time.Time, seq uint64, now time.Time)
	Held() (minSeq uint64, ok bool)
	OpenWindows() (units, keys int)
	Watermark(now time.Time) time.Time
	Resume(through time.Time)
	Stored(width time.Duration, done map[time.Time]uint64)
}

// newSamplePipeline resets the consumer to its stored floor, reads the ledger of k.table back
// from ClickHouse, and returns the pipeline from o.Stream to k.table.
func newSamplePipeline[S any, K comparable, V, R any, A sampleAggregator[S, K, V, R]](ctx context.Context, o Options, cfg window.Config, d Deps, k sampleKind[S, R, A]) (*Pipeline, error) {
	cons, floor, store, err := resetConsumer(ctx, d.JS, o)
	if err != nil {
		return nil, err
	}
	sk := sink.New(d.CH, o.Consumer)
	ob, err := openOutbox(ctx, store, sk)
	if err != nil {
		return nil, err
	}
	var done ledger
	err = untilRead(ctx, d.Logger, func() (err error) {
		if err := sk.Settle(ctx, ""); err != nil {
			return err
		}
		if done, err = sk.Done(ctx, k.table, floor); err != nil {
			return err
		}
		return ob.read(ctx, o.Stream, k.table, floor)
	})
	if err != nil {
		return nil, err
	}
	if err := checkPositions(ctx, d.JS, o, floor, done.maxSeq()); err != nil {
		return nil, err
	}
	m := d.Metrics.forStream(k.stream)
	st := &sampleStage[S, K, V, R, A]{kind: k, agg: k.newAgg(cfg, done[cfg.Window]), cfg: cfg, sink: sk, m: m}
	done.otherLengths(st.agg, cfg.Window, d.Logger, o.Stream)
	d.Logger.Info("consuming", "stream", o.Stream, "consumer", o.Consumer, "floor", floor, "windows_already_stored", done.windows(), "flushes_to_publish_again", ob.flushes)
	return newPipeline(o, d.JS, d.NC, cons, floor, store, ob, st, d.Publisher, m, d.Logger.With("stream", o.Stream)), nil
}

// sampleStage adds each valid sample to its window; a flush holds the rollups of the windows
// closed, written in one batch, then published on their subjects, then marked flushed.
type sampleStage[S any, K comparable, V, R any, A sampleAggregator[S, K, V, R]] struct {
	kind   sampleKind[S, R, A]
	agg    A
	sample S
	cfg    window.Config
	sink   *sink.ClickHouse
	m      *metrics
}

func (s *sampleStage[S, K, V, R, A]) handle(data []byte, seq uint64, now, stored time.Time) (result, error) {
	if err := s.kind.decode(data, &s.sample); err != nil {
		return 0, err
	}
	if err := s.kind.validate(&s.sample, stored); err != nil {
		return 0, err
	}
	switch s.agg.Add(&s.sample, seq, now) {
	case window.AddedLate:
		return resLate, nil
	case window.Skipped:
		return resSkipped, nil
	}
	return resAdded, nil
}

func (s *sampleStage[S, K, V, R, A]) held() (uint64, bool) { return s.agg.Held() }

func (s *sampleStage[S, K, V, R, A]) full() bool { return false }

func (s *sampleStage[S, K, V, R, A]) buffered() int {
	_, keys := s.agg.OpenWindows()
	return s.kind.keyWeight * keys
}

func (s *sampleStage[S, K, V, R, A]) observe(now time.Time) {
	units, keys := s.agg.OpenWindows()
	s.m.openWindows.Set(float64(units))
	s.m.activeKeys.Set(float64(keys))
	if wm := s.agg.Watermark(now); wm.Unix() > 0 {
		s.m.watermarkDelay.Set(now.Sub(wm).Seconds())
	}
	if s.kind.forgetIdle != nil {
		s.kind.forgetIdle(s.agg, now)
	}
}

// closedThrough is zero, no part in the watermark, unless the kind takes part in it.
func (s *sampleStage[S, K, V, R, A]) closedThrough(now time.Time) time.Time {
	if !s.kind.watermark {
		return time.Time{}
	}
	return windowsClosedThrough(s.agg.Watermark(now), s.cfg.Window, s.cfg.Lateness)
}

func (s *sampleStage[S, K, V, R, A]) inWatermark() bool { return s.kind.watermark }

func (s *sampleStage[S, K, V, R, A]) resume(through time.Time) { s.agg.Resume(through) }

func (s *sampleStage[S, K, V, R, A]) cut(now time.Time, seqThrough uint64) flush {
	f := &sampleFlush[S, K, V, R, A]{stage: s, ledger: sink.Ledger{SeqThrough: seqThrough, FlushID: events.NewEventID()}}
	for _, u := range s.agg.Advance(now) {
		f.rows = s.agg.Rollups(u, f.rows)
		f.starts = append(f.starts, u.Start)
		s.agg.Release(u)
	}
	return f
}

type sampleFlush[S any, K comparable, V, R any, A sampleAggregator[S, K, V, R]] struct {
	stage   *sampleStage[S, K, V, R, A]
	ledger  sink.Ledger
	rows    []R
	starts  []time.Time
	attempt int
	msgs    []sink.OutboxMsg
}

func (f *sampleFlush[S, K, V, R, A]) id() sink.Ledger { return f.ledger }
func (f *sampleFlush[S, K, V, R, A]) empty() bool     { return len(f.rows) == 0 }
func (f *sampleFlush[S, K, V, R, A]) count() int      { return len(f.rows) }

// write stores the flush; a retry first settles the earlier attempt and writes nothing if
// it landed (a batch insert is one part, all or nothing).
func (f *sampleFlush[S, K, V, R, A]) write(ctx context.Context, now time.Time) error {
	k, sk := &f.stage.kind, f.stage.sink
	f.attempt++
	if f.attempt > 1 {
		if err := sk.Settle(ctx, f.ledger.FlushID); err != nil {
			return err
		}
		n, err := sk.RowsOfFlush(ctx, k.table, f.ledger.FlushID)
		if err != nil {
			return err
		}
		if n == uint64(len(f.rows)) {
			return nil
		}
	}
	return k.write(sk, sk.WithQueryID(ctx, f.ledger.FlushID+k.queryID+strconv.Itoa(f.attempt)), f.rows, f.ledger, now)
}

// messages are each stored row on its subject, with the message id <flush id>-<i>.
func (f *sampleFlush[S, K, V, R, A]) messages() []sink.OutboxMsg {
	if f.msgs == nil {
		f.msgs = encode(f.rows, f.ledger.FlushID, func(r *R) (string, any) { return f.stage.kind.subject(r), r })
	}
	return f.msgs
}

func (f *sampleFlush[S, K, V, R, A]) done(now time.Time) {
	s := f.stage
	s.agg.Flushed(f.starts, f.ledger.SeqThrough, now)
	for i := range f.rows {
		if start, kind := s.kind.windowOf(&f.rows[i]); kind == events.KindWindow {
			s.m.writeDelay.Observe(now.Sub(start.Add(s.cfg.Window)).Seconds())
		}
	}
}
