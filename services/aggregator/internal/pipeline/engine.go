package pipeline

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// engineKeyWeight is how many buffered request events one held engine key counts for in
// the memory bound: a key holds four histograms of up to 129 buckets.
const engineKeyWeight = 10

// NewEngine returns the pipeline from ENGINE_SAMPLES to engine_rollups; see NewTokens.
func NewEngine(ctx context.Context, o Options, cfg window.Config, d Deps) (*Pipeline, error) {
	cons, floor, store, err := resetConsumer(ctx, d.JS, o)
	if err != nil {
		return nil, err
	}
	sk := sink.New(d.CH, o.Consumer)
	var done map[time.Time]uint64
	err = untilRead(ctx, d.Logger, func() (err error) {
		if err := sk.Settle(ctx, ""); err != nil {
			return err
		}
		done, err = sk.Done(ctx, "engine_rollups", floor)
		return err
	})
	if err != nil {
		return nil, err
	}
	m := d.Metrics.forStream("engine")
	st := &engineStage{agg: window.NewEngine(cfg, done), cfg: cfg, sink: sk, m: m}
	d.Logger.Info("consuming", "stream", o.Stream, "consumer", o.Consumer, "floor", floor, "windows_already_stored", len(done))
	return newPipeline(o, d.JS, d.NC, cons, floor, store, st, d.Publisher, m, d.Logger.With("stream", o.Stream)), nil
}

type engineStage struct {
	agg    *window.EngineAggregator
	sample events.EngineSample
	cfg    window.Config
	sink   *sink.ClickHouse
	m      *metrics
}

func (s *engineStage) handle(data []byte, seq uint64, now time.Time) (result, error) {
	if err := events.UnmarshalEngineSample(data, &s.sample); err != nil {
		return 0, err
	}
	if err := s.sample.ValidateAt(now); err != nil {
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

func (s *engineStage) held() (uint64, bool) { return s.agg.Held() }

func (s *engineStage) full() bool { return false }

func (s *engineStage) buffered() int {
	_, keys := s.agg.OpenWindows()
	return engineKeyWeight * keys
}

func (s *engineStage) observe(now time.Time) {
	units, keys := s.agg.OpenWindows()
	s.m.openWindows.Set(float64(units))
	s.m.activeKeys.Set(float64(keys))
	if wm := s.agg.Watermark(now); wm.Unix() > 0 {
		s.m.watermarkDelay.Set(now.Sub(wm).Seconds())
	}
}

func (s *engineStage) cut(now time.Time, seqThrough uint64) flush {
	f := &engineFlush{stage: s, ledger: sink.Ledger{SeqThrough: seqThrough, FlushID: events.NewEventID()}}
	for _, u := range s.agg.Advance(now) {
		f.rows = s.agg.Rollups(u, f.rows)
		f.starts = append(f.starts, u.Start)
		s.agg.Release(u)
	}
	return f
}

type engineFlush struct {
	stage   *engineStage
	ledger  sink.Ledger
	rows    []events.EngineRollup
	starts  []time.Time
	attempt int
}

func (f *engineFlush) empty() bool { return len(f.rows) == 0 }
func (f *engineFlush) count() int  { return len(f.rows) }

// write stores the flush; a retry first settles the earlier attempt and writes nothing if
// it landed (a batch insert is one part, all or nothing).
func (f *engineFlush) write(ctx context.Context, now time.Time) error {
	sk := f.stage.sink
	f.attempt++
	if f.attempt > 1 {
		if err := sk.Settle(ctx, f.ledger.FlushID); err != nil {
			return err
		}
		n, err := sk.RowsOfFlush(ctx, "engine_rollups", f.ledger.FlushID)
		if err != nil {
			return err
		}
		if n == uint64(len(f.rows)) {
			return nil
		}
	}
	return sk.WriteEngineRollups(sk.WithQueryID(ctx, f.ledger.FlushID+"-engine-"+strconv.Itoa(f.attempt)), f.rows, f.ledger, now)
}

func (f *engineFlush) publish(p *bus.Publisher) {
	for i := range f.rows {
		r := &f.rows[i]
		data, err := json.Marshal(r)
		if err != nil {
			continue // a rollup of finite numbers always encodes
		}
		p.Publish(events.EngineRollupSubject(r.Host), f.ledger.FlushID+"-"+strconv.Itoa(i), data)
	}
}

func (f *engineFlush) done(now time.Time) {
	s := f.stage
	s.agg.Flushed(f.starts, f.ledger.SeqThrough, now)
	for i := range f.rows {
		if f.rows[i].Kind == events.KindWindow {
			s.m.writeDelay.Observe(now.Sub(f.rows[i].WindowStart.Add(s.cfg.Window)).Seconds())
		}
	}
}
