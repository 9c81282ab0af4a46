package window

import (
	"math"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/digest"
)

// FeedbackKey identifies one feedback series in one window: the labels the feedback event
// carries (empty when it does not), the verdict's name and its source.
type FeedbackKey struct {
	Env, Scene, Model, Name, Source string
}

// FeedbackStats are one key's aggregates in one window.
type FeedbackStats struct {
	Count, Positive, Late uint64
	Sum                   float64
	Values                *digest.Digest
}

// FeedbackUnit is a unit of feedback windows.
type FeedbackUnit = Unit[FeedbackKey, FeedbackStats]

// FeedbackRollup is one window × env × scene × model × name × source of feedback, as
// written to feedback_rollups.
type FeedbackRollup struct {
	WindowStart   time.Time
	WindowSeconds int
	Kind          string
	FeedbackKey
	Count, Positive, Late uint64
	Sum                   float64
	Values                events.Latency // the digest of the values, as the latencies' are kept
}

// FeedbackAggregator keeps feedback windows, by the time each verdict was given. Verdicts
// arrive long after the requests they rate; they are windowed by their own ts, and tied to
// their request in SQL (see schemas/clickhouse/queries). It is not safe for concurrent use.
type FeedbackAggregator struct {
	windows[FeedbackKey, FeedbackStats]
	cfg    Config
	series *seriesLimit
}

// NewFeedback returns a FeedbackAggregator; done is as for New.
func NewFeedback(cfg Config, done map[time.Time]uint64) *FeedbackAggregator {
	if cfg.Compression <= 0 {
		cfg.Compression = digest.DefaultCompression
	}
	c := cfg.Compression
	return &FeedbackAggregator{
		windows: newWindows[FeedbackKey, FeedbackStats](cfg.Window, cfg.Lateness, done,
			func() *FeedbackStats { return &FeedbackStats{Values: digest.New(c)} },
			func(s *FeedbackStats) { v := s.Values; v.Reset(); *s = FeedbackStats{Values: v} }),
		cfg:    cfg,
		series: newSeriesLimit(cfg.MaxSeries, seriesIdle(cfg.Window, cfg.Lateness)),
	}
}

// Add routes one valid feedback event at stream position seq; see Aggregator.Add. The
// series limit bounds env × scene × model × name, folding past it into "other".
func (a *FeedbackAggregator) Add(ev *events.FeedbackEvent, seq uint64, now time.Time) Result {
	ts := ev.TS.UnixNano()
	clock := now.UnixNano()
	u, res := a.route(ts, ts, seq, clock)
	if res == Skipped {
		return res
	}
	k := FeedbackKey{Env: ev.Env, Scene: ev.Scene, Model: ev.Model, Name: ev.Name, Source: string(ev.Source)}
	k.Env, k.Scene, k.Model, k.Name = a.series.admit(k.Env, k.Scene, k.Model, k.Name, clock)
	s := a.stats(u, k, func(k FeedbackKey) FeedbackKey {
		return FeedbackKey{Env: strings.Clone(k.Env), Scene: strings.Clone(k.Scene), Model: strings.Clone(k.Model),
			Name: strings.Clone(k.Name), Source: strings.Clone(k.Source)}
	})
	s.Count++
	s.Sum += ev.Value
	if events.Positive(ev.Value) {
		s.Positive++
	}
	s.Values.Add(ev.Value)
	if res == AddedLate {
		s.Late++
	}
	return res
}

// Advance closes the windows the watermark has passed; see windows.Advance.
func (a *FeedbackAggregator) Advance(now time.Time) []*FeedbackUnit {
	a.series.expire(now.UnixNano())
	return a.windows.Advance(now)
}

// Folded returns how many verdicts were folded into "other" series.
func (a *FeedbackAggregator) Folded() uint64 { return a.series.folded }

// Rollups turns a unit into one rollup per key.
func (a *FeedbackAggregator) Rollups(u *FeedbackUnit, dst []FeedbackRollup) []FeedbackRollup {
	kind := events.KindWindow
	if u.Correction {
		kind = events.KindCorrection
	}
	for k, s := range u.Keys {
		v := latency(s.Values)
		if math.IsNaN(v.Min) || math.IsNaN(v.Max) {
			v.Min, v.Max = 0, 0
		}
		dst = append(dst, FeedbackRollup{
			WindowStart: u.Start, WindowSeconds: int(a.cfg.Window / time.Second), Kind: kind, FeedbackKey: k,
			Count: s.Count, Positive: s.Positive, Late: s.Late, Sum: s.Sum, Values: v,
		})
	}
	return dst
}
