package window

import (
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/digest"
)

// Pricer returns a request's cost in USD, and false for a model without a price.
type Pricer interface {
	Cost(model string, input, cached, output int64) (float64, bool)
}

// Config shapes the windows.
type Config struct {
	Window      time.Duration
	Lateness    time.Duration
	Buckets     events.Buckets
	MaxSeries   int // distinct env × scene × model × instance before folding into "other"
	Compression float64
	Prices      Pricer
}

// Key identifies one series in one window.
type Key struct {
	Env, Scene, Model, Instance string
	Bucket                      int
}

// Stats are one key's aggregates in one window.
type Stats struct {
	Requests, OK, Errors, Timeouts, Canceled, RateLimited, Late, Estimated, Unpriced uint64
	InputTokens, OutputTokens, CachedInputTokens                                     uint64
	CostUSD, MaxITLMs                                                                float64
	TTFT, TPOT, Total                                                                *digest.Digest
}

func (s *Stats) reset() {
	ttft, tpot, total := s.TTFT, s.TPOT, s.Total
	*s = Stats{TTFT: ttft, TPOT: tpot, Total: total}
	ttft.Reset()
	tpot.Reset()
	total.Reset()
}

// Unit is one window's aggregates — the window itself, or a correction of it — with the
// stream positions it holds. Ack is whatever the caller passed with the message processed
// just before the unit's first one: acknowledging it (cumulatively) releases everything
// before this unit.
type Unit struct {
	Start      time.Time
	Correction bool
	MinSeq     uint64
	Ack        any
	Keys       map[Key]*Stats
}

// Aggregator holds the open windows. It is not safe for concurrent use.
type Aggregator struct {
	cfg    Config
	window int64 // ns
	late   int64 // ns

	open map[int64]*Unit // window start (unix ns) → the window
	corr map[int64]*Unit // window start → its pending correction

	// done records, per window start, the highest stream sequence whose events are already
	// in ClickHouse (learnt at start from the rows' seq_through, and from every flush).
	done map[int64]uint64

	maxEnd      int64 // latest request end seen, unix ns, clamped to the clock
	lastArrival int64 // clock when an event last arrived

	series *seriesLimit
	free   []*Stats
	units  []*Unit
}

// New returns an Aggregator. done lists, per window start, the stream sequence through which
// that window's events are already stored, so a restart skips them.
func New(cfg Config, done map[time.Time]uint64) *Aggregator {
	if cfg.Compression <= 0 {
		cfg.Compression = digest.DefaultCompression
	}
	a := &Aggregator{
		cfg:    cfg,
		window: int64(cfg.Window),
		late:   int64(cfg.Lateness),
		open:   map[int64]*Unit{},
		corr:   map[int64]*Unit{},
		done:   map[int64]uint64{},
		series: newSeriesLimit(cfg.MaxSeries),
	}
	for t, seq := range done {
		a.done[t.UnixNano()] = seq
	}
	return a
}

// Result says what Add did with an event.
type Result int

// Add results.
const (
	Added     Result = iota // into its open window
	AddedLate               // into a correction: its window had closed
	Skipped                 // already stored before a restart
)

// Add routes one valid event at stream position seq. ack is the caller's handle of the
// message processed before this one (see Unit.Ack); now is the clock.
func (a *Aggregator) Add(ev *events.RequestEvent, seq uint64, ack any, now time.Time) Result {
	ts := ev.TS.UnixNano()
	start := floorDiv(ts, a.window) * a.window
	if seq <= a.done[start] {
		return Skipped
	}
	clock := now.UnixNano()
	a.lastArrival = clock
	if end := ts + int64(ev.TotalMs*1e6); end > a.maxEnd {
		a.maxEnd = min(end, clock)
	}
	res := Added
	u := a.open[start]
	if u == nil {
		if start+a.window+a.late <= a.watermark(clock) {
			res = AddedLate
			if u = a.corr[start]; u == nil {
				u = a.newUnit(start, true, seq, ack)
				a.corr[start] = u
			}
		} else {
			_, restarted := a.done[start]
			u = a.newUnit(start, restarted, seq, ack)
			a.open[start] = u
		}
	}
	k := Key{Env: ev.Env, Scene: ev.Scene, Model: ev.Model, Instance: ev.Instance, Bucket: a.cfg.Buckets.Index(ev.InputTokens)}
	k.Env, k.Scene, k.Model, k.Instance = a.series.admit(k.Env, k.Scene, k.Model, k.Instance, clock)
	s := u.Keys[k]
	if s == nil {
		s = a.newStats()
		k.Env, k.Scene, k.Model, k.Instance = strings.Clone(k.Env), strings.Clone(k.Scene), strings.Clone(k.Model), strings.Clone(k.Instance)
		u.Keys[k] = s
	}
	a.count(s, ev)
	if res == AddedLate {
		s.Late++
	}
	return res
}

func (a *Aggregator) count(s *Stats, ev *events.RequestEvent) {
	s.Requests++
	switch ev.Status {
	case events.StatusOK:
		s.OK++
	case events.StatusError:
		s.Errors++
	case events.StatusTimeout:
		s.Timeouts++
	case events.StatusCanceled:
		s.Canceled++
	}
	if ev.RateLimited() {
		s.RateLimited++
	}
	if ev.TokensEstimated {
		s.Estimated++
	}
	s.InputTokens += uint64(ev.InputTokens)
	s.OutputTokens += uint64(ev.OutputTokens)
	s.CachedInputTokens += uint64(ev.CachedInputTokens)
	if a.cfg.Prices != nil {
		if usd, ok := a.cfg.Prices.Cost(ev.Model, ev.InputTokens, ev.CachedInputTokens, ev.OutputTokens); ok {
			s.CostUSD += usd
		} else {
			s.Unpriced++
		}
	}
	s.MaxITLMs = max(s.MaxITLMs, ev.MaxITLMs)
	// TTFT counts every request that got a first token; TPOT and total only successful ones,
	// as vLLM's benchmark does, so a failure's short latency cannot flatter them.
	if ev.Status == events.StatusOK || ev.OutputTokens > 0 {
		s.TTFT.Add(ev.TTFTMs)
	}
	if ev.Status == events.StatusOK {
		s.Total.Add(ev.TotalMs)
		if tpot, ok := ev.TPOT(); ok {
			s.TPOT.Add(tpot)
		}
	}
}

// watermark is how far event time has surely progressed: the latest request end seen,
// moved on by the time since the last arrival, never ahead of the clock.
func (a *Aggregator) watermark(clock int64) int64 {
	if a.maxEnd == 0 {
		return 0
	}
	return min(clock, a.maxEnd+max(0, clock-a.lastArrival))
}

// Watermark returns the current watermark for the clock now.
func (a *Aggregator) Watermark(now time.Time) time.Time {
	return time.Unix(0, a.watermark(now.UnixNano())).UTC()
}

// Advance closes every window the watermark has passed, and hands out every pending
// correction, oldest first. The caller turns units into rollups and then Releases them.
func (a *Aggregator) Advance(now time.Time) []*Unit {
	wm := a.watermark(now.UnixNano())
	var out []*Unit
	for start, u := range a.open {
		if start+a.window+a.late <= wm {
			out = append(out, u)
			delete(a.open, start)
		}
	}
	for start, u := range a.corr {
		out = append(out, u)
		delete(a.corr, start)
	}
	sortUnits(out)
	a.series.expire(now.UnixNano())
	return out
}

// Flushed records that the units' events through seq are stored, so that events of those
// windows redelivered after a restart are skipped. Old entries are forgotten once the
// watermark is far past them.
func (a *Aggregator) Flushed(units []*Unit, seq uint64, now time.Time) {
	for _, u := range units {
		start := u.Start.UnixNano()
		a.done[start] = max(a.done[start], seq)
	}
	horizon := a.watermark(now.UnixNano()) - 2*(a.window+a.late) - int64(time.Hour)
	for start := range a.done {
		if start < horizon {
			delete(a.done, start)
		}
	}
}

// Held returns the unit with the lowest stream position still held open (not handed out
// by Advance), and false when none is.
func (a *Aggregator) Held() (minSeq uint64, ack any, ok bool) {
	for _, m := range []map[int64]*Unit{a.open, a.corr} {
		for _, u := range m {
			if !ok || u.MinSeq < minSeq {
				minSeq, ack, ok = u.MinSeq, u.Ack, true
			}
		}
	}
	return minSeq, ack, ok
}

// OpenWindows returns how many windows and corrections are held, and their keys.
func (a *Aggregator) OpenWindows() (units, keys int) {
	for _, m := range []map[int64]*Unit{a.open, a.corr} {
		for _, u := range m {
			units++
			keys += len(u.Keys)
		}
	}
	return units, keys
}

// Release returns a unit's storage for reuse once its rollups are built.
func (a *Aggregator) Release(u *Unit) {
	for k, s := range u.Keys {
		s.reset()
		a.free = append(a.free, s)
		delete(u.Keys, k)
	}
	u.Ack = nil
	a.units = append(a.units, u)
}

// Folded returns how many events were folded into "other" series.
func (a *Aggregator) Folded() uint64 { return a.series.folded }

func (a *Aggregator) newUnit(start int64, correction bool, seq uint64, ack any) *Unit {
	var u *Unit
	if n := len(a.units); n > 0 {
		u, a.units = a.units[n-1], a.units[:n-1]
	} else {
		u = &Unit{Keys: map[Key]*Stats{}}
	}
	u.Start = time.Unix(0, start).UTC()
	u.Correction = correction
	u.MinSeq = seq
	u.Ack = ack
	return u
}

func (a *Aggregator) newStats() *Stats {
	if n := len(a.free); n > 0 {
		s := a.free[n-1]
		a.free = a.free[:n-1]
		return s
	}
	c := a.cfg.Compression
	return &Stats{TTFT: digest.New(c), TPOT: digest.New(c), Total: digest.New(c)}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func sortUnits(us []*Unit) {
	for i := 1; i < len(us); i++ {
		for j := i; j > 0 && less(us[j], us[j-1]); j-- {
			us[j], us[j-1] = us[j-1], us[j]
		}
	}
}

func less(a, b *Unit) bool {
	if !a.Start.Equal(b.Start) {
		return a.Start.Before(b.Start)
	}
	return !a.Correction && b.Correction
}
