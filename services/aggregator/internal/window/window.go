package window

import (
	"cmp"
	"math"
	"slices"
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
	MaxSeries   int // env × scene × model × instance series in use at once before folding into "other"
	Compression float64
	Prices      Pricer
}

// Key identifies one series in one window. Layer keeps the same requests seen at two
// layers apart; it takes no part in the series limit (there are three).
type Key struct {
	Env, Scene, Model, Instance string
	Layer                       events.Layer
	Bucket                      int
}

// Stats are one key's aggregates in one window.
type Stats struct {
	Requests, OK, Errors, Timeouts, Canceled, RateLimited, Late, Estimated, Unpriced uint64
	Completed, Abandoned                                                             uint64 // requests' outcome
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
// lowest stream position it holds: everything before the oldest unit's is stored.
type Unit[K comparable, S any] struct {
	Start      time.Time
	Correction bool
	MinSeq     uint64
	Keys       map[K]*S
}

// windows is the bookkeeping every kind of window shares: which are open, which closed
// windows have a pending correction, what a restart must skip, and the watermark.
type windows[K comparable, S any] struct {
	window int64 // ns
	late   int64 // ns

	open map[int64]*Unit[K, S] // window start (unix ns) → the window
	corr map[int64]*Unit[K, S] // window start → its pending correction

	// done records, per window start, the highest stream sequence whose events are already
	// in ClickHouse (learnt at start from the rows' seq_through, and from every flush).
	done map[int64]uint64
	// other is the ledger of windows of other lengths (AGG_WINDOW changed across a
	// restart), by length (ns): an event is stored if the window of any length holding it is
	// stored through its position.
	other map[int64]map[int64]uint64
	// written marks the windows this process wrote: what arrives for them is late.
	written map[int64]bool
	// closed is the end (unix ns) through which an earlier process published every window
	// as closed (its last watermark, see Resume); 0 when none.
	closed int64

	maxEnd      int64 // latest event end seen, unix ns, clamped to the clock
	lastArrival int64 // clock when an event last arrived

	newStats   func() *S
	resetStats func(*S)
	free       []*S
	units      []*Unit[K, S]
}

func newWindows[K comparable, S any](window, lateness time.Duration, done map[time.Time]uint64, newStats func() *S, reset func(*S)) windows[K, S] {
	w := windows[K, S]{
		window: int64(window), late: int64(lateness),
		open: map[int64]*Unit[K, S]{}, corr: map[int64]*Unit[K, S]{}, done: map[int64]uint64{}, written: map[int64]bool{},
		newStats: newStats, resetStats: reset,
	}
	for t, seq := range done {
		w.done[t.UnixNano()] = seq
	}
	return w
}

// route finds the unit for an event at ts (unix ns) ending at end, at stream position seq.
func (w *windows[K, S]) route(ts, end int64, seq uint64, clock int64) (*Unit[K, S], Result) {
	start := floorDiv(ts, w.window) * w.window
	if seq <= w.done[start] {
		return nil, Skipped
	}
	for width, done := range w.other {
		if seq <= done[floorDiv(ts, width)*width] {
			return nil, Skipped
		}
	}
	wm := w.watermark(clock) // as it was before this event
	// The watermark never goes back: after a quiet spell it has moved on with the clock, and
	// what it passed was closed and published as passed; an older event must not take it back.
	// Nor does it start behind what an earlier process published (Resume).
	w.maxEnd = max(w.maxEnd, wm, min(end, clock))
	if w.closed != 0 {
		w.maxEnd = max(w.maxEnd, min(w.closed+w.late, clock))
	}
	w.lastArrival = clock
	if u := w.open[start]; u != nil {
		return u, Added
	}
	if start+w.window+w.late <= wm || w.written[start] || (w.closed != 0 && start+w.window <= w.closed) {
		u := w.corr[start]
		if u == nil {
			u = w.newUnit(start, true, seq)
			w.corr[start] = u
		}
		return u, AddedLate
	}
	// A window stored before a restart gets its remainder as a correction, not counted late.
	_, restarted := w.done[start]
	u := w.newUnit(start, restarted, seq)
	w.open[start] = u
	return u, Added
}

// Stored records the ledger of windows of length width, stored by an earlier process that
// had another AGG_WINDOW: per window start, the stream position through which its events are
// stored. An event it covers is skipped, as one covered by a window of the current length:
// the rows of the old length hold it, and an event of one of its windows left open is
// counted in a window of the new length. For the current length it adds to done (New).
func (w *windows[K, S]) Stored(width time.Duration, done map[time.Time]uint64) {
	if width <= 0 || len(done) == 0 {
		return
	}
	m := w.done
	if int64(width) != w.window {
		if w.other == nil {
			w.other = map[int64]map[int64]uint64{}
		}
		if m = w.other[int64(width)]; m == nil {
			m = map[int64]uint64{}
			w.other[int64(width)] = m
		}
	}
	for t, seq := range done {
		m[t.UnixNano()] = max(m[t.UnixNano()], seq)
	}
}

// Resume records that an earlier process published every window ending at or before
// through as closed (its last watermark): what comes for them now is late, a correction,
// as it would have been for that process, never an ordinary window behind the watermark.
// From the first event on, the watermark is at least where that process had it when it
// closed them (through + lateness), and moves on from there as usual; before it, there is
// none, as for any start.
func (w *windows[K, S]) Resume(through time.Time) {
	if through.Unix() > 0 {
		w.closed = max(w.closed, through.UnixNano())
	}
}

// stats returns the unit's stats for k, creating them from the free list.
func (w *windows[K, S]) stats(u *Unit[K, S], k K, clone func(K) K) *S {
	s := u.Keys[k]
	if s == nil {
		if n := len(w.free); n > 0 {
			s, w.free = w.free[n-1], w.free[:n-1]
		} else {
			s = w.newStats()
		}
		u.Keys[clone(k)] = s
	}
	return s
}

// watermark is how far event time has surely progressed: the latest event end seen, moved
// on by the time since the last arrival, never ahead of the clock.
func (w *windows[K, S]) watermark(clock int64) int64 {
	if w.maxEnd == 0 {
		return 0
	}
	return min(clock, w.maxEnd+max(0, clock-w.lastArrival))
}

// Watermark returns the current watermark for the clock now.
func (w *windows[K, S]) Watermark(now time.Time) time.Time {
	return time.Unix(0, w.watermark(now.UnixNano())).UTC()
}

// Advance closes every window the watermark has passed, and hands out every pending
// correction, oldest first. The caller turns units into rollups and then Releases them.
func (w *windows[K, S]) Advance(now time.Time) []*Unit[K, S] {
	wm := w.watermark(now.UnixNano())
	var out []*Unit[K, S]
	for start, u := range w.open {
		if start+w.window+w.late <= wm {
			out = append(out, u)
			delete(w.open, start)
		}
	}
	for start, u := range w.corr {
		out = append(out, u)
		delete(w.corr, start)
	}
	slices.SortFunc(out, func(a, b *Unit[K, S]) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return cmp.Compare(b2i(a.Correction), b2i(b.Correction))
	})
	return out
}

// Drain hands out every unit, open or not, for a final flush (tests and tools; the
// service leaves open windows to the next start instead).
func (w *windows[K, S]) Drain() []*Unit[K, S] {
	w.maxEnd = math.MaxInt64
	w.lastArrival = math.MaxInt64
	out := w.Advance(time.Unix(0, math.MaxInt64))
	w.maxEnd, w.lastArrival = 0, 0
	return out
}

// Flushed records that the events through seq of the windows starting at starts are stored, so that events of those
// windows redelivered after a restart are skipped. Old entries are forgotten once the
// watermark is far past them, and once seq has passed them: an entry read at start that
// reaches further into the replay still has events to skip, late ones of an old window
// among the current events (a correction stored before the restart).
func (w *windows[K, S]) Flushed(starts []time.Time, seq uint64, now time.Time) {
	for _, t := range starts {
		start := t.UnixNano()
		w.done[start] = max(w.done[start], seq)
		w.written[start] = true
	}
	horizon := w.watermark(now.UnixNano()) - 2*(w.window+w.late) - int64(time.Hour)
	for start, through := range w.done {
		if start < horizon && through <= seq {
			delete(w.done, start)
			delete(w.written, start)
		}
	}
	for width, done := range w.other {
		for start, through := range done {
			if start < horizon && through <= seq {
				delete(done, start)
			}
		}
		if len(done) == 0 {
			delete(w.other, width)
		}
	}
}

// Held returns the lowest stream position held by a unit not yet handed out by Advance, and
// false when nothing is held.
func (w *windows[K, S]) Held() (minSeq uint64, ok bool) {
	for _, m := range []map[int64]*Unit[K, S]{w.open, w.corr} {
		for _, u := range m {
			if !ok || u.MinSeq < minSeq {
				minSeq, ok = u.MinSeq, true
			}
		}
	}
	return minSeq, ok
}

// OpenWindows returns how many windows and corrections are held, and their keys.
func (w *windows[K, S]) OpenWindows() (units, keys int) {
	for _, m := range []map[int64]*Unit[K, S]{w.open, w.corr} {
		for _, u := range m {
			units++
			keys += len(u.Keys)
		}
	}
	return units, keys
}

// Release returns a unit's storage for reuse once its rollups are built.
func (w *windows[K, S]) Release(u *Unit[K, S]) {
	for k, s := range u.Keys {
		w.resetStats(s)
		w.free = append(w.free, s)
		delete(u.Keys, k)
	}
	w.units = append(w.units, u)
}

func (w *windows[K, S]) newUnit(start int64, correction bool, seq uint64) *Unit[K, S] {
	var u *Unit[K, S]
	if n := len(w.units); n > 0 {
		u, w.units = w.units[n-1], w.units[:n-1]
	} else {
		u = &Unit[K, S]{Keys: map[K]*S{}}
	}
	u.Start = time.Unix(0, start).UTC()
	u.Correction = correction
	u.MinSeq = seq
	return u
}

// TokenUnit is a unit of request-event windows.
type TokenUnit = Unit[Key, Stats]

// Aggregator keeps request-event windows. It is not safe for concurrent use.
type Aggregator struct {
	windows[Key, Stats]
	cfg    Config
	series *seriesLimit
}

// New returns an Aggregator. done lists, per window start, the stream sequence through which
// that window's events are already stored, so a restart skips them.
func New(cfg Config, done map[time.Time]uint64) *Aggregator {
	if cfg.Compression <= 0 {
		cfg.Compression = digest.DefaultCompression
	}
	c := cfg.Compression
	return &Aggregator{
		windows: newWindows[Key, Stats](cfg.Window, cfg.Lateness, done,
			func() *Stats { return &Stats{TTFT: digest.New(c), TPOT: digest.New(c), Total: digest.New(c)} },
			(*Stats).reset),
		cfg:    cfg,
		series: newSeriesLimit(cfg.MaxSeries, seriesIdle(cfg.Window, cfg.Lateness)),
	}
}

// Result says what Add did with an event.
type Result int

// Add results.
const (
	Added     Result = iota // into its open window
	AddedLate               // into a correction: its window had closed
	Skipped                 // already stored before a restart
)

// Priced is an event's input-length bucket and cost, worked out once for whoever else needs
// them too (the raw requests table).
type Priced struct {
	Bucket int     // index into Config.Buckets
	USD    float64 // 0 when unpriced
	OK     bool    // the model has a price
}

// Price returns ev's bucket and cost.
func (a *Aggregator) Price(ev *events.RequestEvent) Priced {
	p := Priced{Bucket: a.cfg.Buckets.Index(ev.InputTokens)}
	if a.cfg.Prices != nil {
		p.USD, p.OK = a.cfg.Prices.Cost(ev.Model, ev.InputTokens, ev.CachedInputTokens, ev.OutputTokens)
	}
	return p
}

// Add routes one valid event at stream position seq; now is the clock.
func (a *Aggregator) Add(ev *events.RequestEvent, seq uint64, now time.Time) Result {
	return a.AddPriced(ev, a.Price(ev), seq, now)
}

// AddPriced is Add for an event whose Price the caller already has.
func (a *Aggregator) AddPriced(ev *events.RequestEvent, p Priced, seq uint64, now time.Time) Result {
	ts := ev.TS.UnixNano()
	clock := now.UnixNano()
	u, res := a.route(ts, ts+int64(ev.TotalMs*1e6), seq, clock)
	if res == Skipped {
		return res
	}
	k := Key{Env: ev.Env, Scene: ev.Scene, Model: ev.Model, Instance: ev.Instance, Layer: layerOf(ev), Bucket: p.Bucket}
	k.Env, k.Scene, k.Model, k.Instance = a.series.admit(k.Env, k.Scene, k.Model, k.Instance, clock)
	s := a.stats(u, k, cloneKey)
	a.count(s, ev, p)
	if res == AddedLate {
		s.Late++
	}
	return res
}

// Advance closes the windows the watermark has passed; see windows.Advance.
func (a *Aggregator) Advance(now time.Time) []*TokenUnit {
	a.series.expire(now.UnixNano())
	return a.windows.Advance(now)
}

func cloneKey(k Key) Key {
	return Key{Env: strings.Clone(k.Env), Scene: strings.Clone(k.Scene), Model: strings.Clone(k.Model), Instance: strings.Clone(k.Instance), Layer: k.Layer, Bucket: k.Bucket}
}

// layerOf returns the event's layer as one of the package's constants, so that a key holds
// nothing of the message it came from; a valid event has no other layer.
func layerOf(ev *events.RequestEvent) events.Layer {
	switch ev.Layer {
	case events.LayerEngine:
		return events.LayerEngine
	case events.LayerApp:
		return events.LayerApp
	}
	return events.LayerGateway
}

func (a *Aggregator) count(s *Stats, ev *events.RequestEvent, p Priced) {
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
	switch ev.Outcome {
	case events.OutcomeCompleted:
		s.Completed++
	case events.OutcomeAbandoned:
		s.Abandoned++
	}
	if ev.TokensEstimated {
		s.Estimated++
	}
	s.InputTokens += uint64(ev.InputTokens)
	s.OutputTokens += uint64(ev.OutputTokens)
	s.CachedInputTokens += uint64(ev.CachedInputTokens)
	if a.cfg.Prices != nil {
		if p.OK {
			s.CostUSD += p.USD
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

// Folded returns how many events were folded into "other" series.
func (a *Aggregator) Folded() uint64 { return a.series.folded }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
