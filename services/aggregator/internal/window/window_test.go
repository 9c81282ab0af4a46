package window_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/price"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func cfg(t testing.TB) window.Config {
	prices, err := price.New([]price.Price{{Model: "m*", Input: 1, Output: 2, CachedInput: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	return window.Config{Window: 15 * time.Second, Lateness: 30 * time.Second, Buckets: events.DefaultBucketBounds(), MaxSeries: 100, Prices: prices}
}

func ev(at time.Duration, status events.Status, in, out int64, ttft, total float64) *events.RequestEvent {
	return &events.RequestEvent{V: 1, EventID: "x", TS: t0.Add(at), Model: "m1", Scene: "chat", Env: "prod",
		InputTokens: in, OutputTokens: out, TTFTMs: ttft, TotalMs: total, Status: status}
}

func rollups(a *window.Aggregator, units []*window.TokenUnit) map[string]events.TokenRollup {
	out := map[string]events.TokenRollup{}
	for _, u := range units {
		for _, r := range a.Rollups(u, nil) {
			out[fmt.Sprintf("%s/%s/%s/%s", r.WindowStart.Format("15:04:05"), r.Kind, r.Model, r.Bucket)] = r
		}
		a.Release(u)
	}
	return out
}

func TestWindowsCloseByWatermark(t *testing.T) {
	a := window.New(cfg(t), nil)
	now := t0.Add(time.Second)
	seq := uint64(0)
	add := func(e *events.RequestEvent) window.Result {
		seq++
		return a.Add(e, seq, now)
	}
	add(ev(0, events.StatusOK, 100, 11, 200, 1200))
	add(ev(time.Second, events.StatusError, 100, 0, 0, 50))
	add(ev(2*time.Second, events.StatusTimeout, 600, 5, 300, 60000))
	add(ev(3*time.Second, events.StatusCanceled, 100, 2, 100, 150))
	e := ev(4*time.Second, events.StatusError, 100, 0, 0, 10)
	e.HTTPStatus = 429
	add(e)
	if got := a.Advance(now); len(got) != 0 {
		t.Fatalf("closed %d windows before the watermark passed", len(got))
	}
	// Event time moves on with a later request; the first window closes at 15s + 30s.
	now = t0.Add(46 * time.Second)
	if r := add(ev(45*time.Second, events.StatusOK, 100, 2, 10, 20)); r != window.Added {
		t.Fatalf("result %v", r)
	}
	units := a.Advance(now)
	if len(units) != 1 || !units[0].Start.Equal(t0) || units[0].MinSeq != 1 {
		t.Fatalf("closed %+v", units)
	}
	got := rollups(a, units)
	short := got["10:00:00/window/m1/0-499"]
	if short.Requests != 4 || short.OK != 1 || short.Errors != 2 || short.Canceled != 1 || short.Timeouts != 0 || short.RateLimited != 1 {
		t.Fatalf("short bucket %+v", short)
	}
	long := got["10:00:00/window/m1/500-1999"]
	if long.Requests != 1 || long.Timeouts != 1 || long.Errors != 0 || long.TTFT.Count != 1 || long.Total.Count != 0 {
		t.Fatalf("a timeout is not an error, and only ok requests have a total: %+v", long)
	}
	// TPOT: (1200-200)/(11-1) = 100 from the ok request; canceled is not ok.
	if short.TPOT.Count != 1 || short.TPOT.P50 != 100 || short.Total.P99 != 1200 {
		t.Fatalf("tpot %+v total %+v", short.TPOT, short.Total)
	}
	// TTFT: the ok one and the canceled one (it got tokens); errors without tokens have none.
	if short.TTFT.Count != 2 {
		t.Fatalf("ttft count %d", short.TTFT.Count)
	}
	if want := (400*1.0 + 13*2.0) / 1e6; short.CostUSD < want-1e-12 || short.CostUSD > want+1e-12 {
		t.Fatalf("cost %v, want %v", short.CostUSD, want)
	}
	// A straggler for the closed window becomes a correction, counted late.
	if r := add(ev(5*time.Second, events.StatusOK, 10, 1, 5, 5)); r != window.AddedLate {
		t.Fatalf("straggler: %v", r)
	}
	if seq, ok := a.Held(); !ok || seq != 6 {
		t.Fatalf("held %d %v: the open window at 45s holds seq 6", seq, ok)
	}
	got = rollups(a, a.Advance(now))
	corr := got["10:00:00/correction/m1/0-499"]
	if corr.Requests != 1 || corr.Late != 1 {
		t.Fatalf("correction %+v (all: %v)", corr, got)
	}
}

func TestQuietStreamStillCloses(t *testing.T) {
	a := window.New(cfg(t), nil)
	a.Add(ev(0, events.StatusOK, 1, 2, 1, 2), 1, t0.Add(time.Second))
	if n := len(a.Advance(t0.Add(40 * time.Second))); n != 0 {
		t.Fatalf("closed early: %d", n)
	}
	if n := len(a.Advance(t0.Add(46 * time.Second))); n != 1 {
		t.Fatalf("a quiet stream must close its window on the clock, closed %d", n)
	}
}

func TestClockBoundsWatermark(t *testing.T) {
	a := window.New(cfg(t), nil)
	// A client clock 4 minutes ahead must not close the current windows.
	a.Add(ev(4*time.Minute, events.StatusOK, 1, 2, 1, 2), 1, t0)
	a.Add(ev(0, events.StatusOK, 1, 2, 1, 2), 2, t0)
	if wm := a.Watermark(t0); wm.After(t0) {
		t.Fatalf("watermark %v ahead of the clock %v", wm, t0)
	}
	if n := len(a.Advance(t0)); n != 0 {
		t.Fatalf("closed %d", n)
	}
}

func TestRestartSkipsStored(t *testing.T) {
	done := map[time.Time]uint64{t0: 10}
	a := window.New(cfg(t), done)
	now := t0.Add(2 * time.Second)
	if r := a.Add(ev(time.Second, events.StatusOK, 1, 2, 1, 2), 9, now); r != window.Skipped {
		t.Fatalf("stored event not skipped: %v", r)
	}
	if r := a.Add(ev(time.Second, events.StatusOK, 1, 2, 1, 2), 11, now); r != window.Added {
		t.Fatalf("new event: %v", r)
	}
	// The same window's remainder is a correction: a window row for it is already stored.
	units := a.Advance(t0.Add(time.Hour))
	if len(units) != 1 || !units[0].Correction {
		t.Fatalf("units %+v", units)
	}
	a.Flushed([]time.Time{units[0].Start}, 11, t0.Add(time.Hour))
	if r := a.Add(ev(time.Second, events.StatusOK, 1, 2, 1, 2), 11, t0.Add(time.Hour)); r != window.Skipped {
		t.Fatalf("redelivered event after a flush: %v", r)
	}
}

// TestRestartSkipsStoredOfAnotherLength: windows stored with another AGG_WINDOW decide
// what a restart skips, by the window of their own length that holds each event.
func TestRestartSkipsStoredOfAnotherLength(t *testing.T) {
	a := window.New(cfg(t), nil)                                                 // 15 s windows now
	a.Stored(5*time.Second, map[time.Time]uint64{t0: 20})                        // [t0, t0+5s) stored through 20
	a.Stored(30*time.Second, map[time.Time]uint64{t0.Add(30 * time.Second): 40}) // [t0+30s, t0+60s) through 40
	now := t0.Add(time.Minute)
	for _, c := range []struct {
		at   time.Duration
		seq  uint64
		want window.Result
	}{
		{time.Second, 10, window.Skipped},      // in the stored 5 s window
		{6 * time.Second, 10, window.Added},    // in the 15 s window at t0, but in no stored 5 s one
		{time.Second, 21, window.Added},        // after the stored 5 s window's seq_through
		{31 * time.Second, 30, window.Skipped}, // in the stored 30 s window
		{50 * time.Second, 40, window.Skipped},
		{50 * time.Second, 41, window.Added},
	} {
		if got := a.Add(ev(c.at, events.StatusOK, 1, 2, 1, 2), c.seq, now); got != c.want {
			t.Errorf("event at +%s, seq %d: %v, want %v", c.at, c.seq, got, c.want)
		}
	}
}

func TestSeriesFolding(t *testing.T) {
	c := cfg(t)
	c.MaxSeries = 3
	a := window.New(c, nil)
	now := t0.Add(time.Second)
	for i := range 10 {
		e := ev(0, events.StatusOK, 1, 2, 1, 2)
		e.Model = fmt.Sprint("m", i)
		a.Add(e, uint64(i+1), now)
	}
	got := rollups(a, a.Advance(t0.Add(time.Hour)))
	var total uint64
	for _, r := range got {
		total += r.Requests
	}
	if len(got) != 4 || total != 10 || got["10:00:00/window/other/0-499"].Requests != 7 || a.Folded() != 7 {
		t.Fatalf("folded into %d series (%d folded): %v", len(got), a.Folded(), got)
	}
}

func TestReuseKeepsCountsApart(t *testing.T) {
	a := window.New(cfg(t), nil)
	for w := range 5 {
		now := t0.Add(time.Duration(w) * time.Minute)
		for i := range 100 {
			a.Add(ev(time.Duration(w)*time.Minute, events.StatusOK, 10, 3, 1, float64(i+2)), uint64(w*100+i+1), now)
		}
		units := a.Advance(now.Add(time.Minute))
		got := rollups(a, units)
		if len(got) != 1 {
			t.Fatalf("window %d: %v", w, got)
		}
		for _, r := range got {
			if r.Requests != 100 || r.Total.Count != 100 || r.Total.Max != 101 {
				t.Fatalf("window %d: reused storage leaked counts: %+v", w, r)
			}
		}
	}
}

// BenchmarkHotPath is the aggregator's per-event work without NATS: decode (interning),
// validate, route to its window and key, three digest adds. Events follow a production-like
// mix: lognormal latencies, 4 models, 3 scenes, input tokens across the buckets, 2k events
// per second of event time.
func BenchmarkHotPath(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 1 << 14
	payloads := make([][]byte, n)
	for i := range payloads {
		out := int64(1 + r.IntN(800))
		// Latencies in ms with microsecond precision, as the emitter writes them.
		us := func(ms float64) float64 { return math.Round(ms*1000) / 1000 }
		ttft := us(200 + 100*r.ExpFloat64())
		e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: t0, Model: fmt.Sprint("model-", r.IntN(4)),
			Scene: fmt.Sprint("scene-", r.IntN(3)), Env: "prod", InputTokens: int64(r.ExpFloat64() * 2000), OutputTokens: out,
			TTFTMs: ttft, TotalMs: us(ttft + float64(out)*(20+10*r.Float64())), Status: events.StatusOK, Stream: true}
		payloads[i] = events.AppendRequest(nil, &e)
	}
	a := window.New(cfg(b), nil)
	dec := events.NewDecoder(1024)
	var e events.RequestEvent
	step := time.Second / 2000
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := dec.Decode(payloads[i&(n-1)], &e); err != nil {
			b.Fatal(err)
		}
		at := time.Duration(i) * step
		e.TS = t0.Add(at)
		now := t0.Add(at)
		if err := e.ValidateAt(now); err != nil {
			b.Fatal(err)
		}
		a.Add(&e, uint64(i+1), now)
		if i%2000 == 0 {
			for _, u := range a.Advance(now) {
				a.Release(u)
			}
		}
	}
}

// TestLayersKeptApart adds the same requests at three layers: each layer gets its own
// rollup with exact counts, and an event without a layer is the gateway's.
func TestLayersKeptApart(t *testing.T) {
	a := window.New(cfg(t), nil)
	now := t0.Add(time.Second)
	seq := uint64(0)
	counts := map[events.Layer]int{"": 5, events.LayerGateway: 2, events.LayerEngine: 6, events.LayerApp: 4}
	for layer, n := range counts {
		for i := range n {
			e := ev(time.Duration(i)*time.Millisecond, events.StatusOK, 100, 11, float64(100+i), 1200)
			e.Layer = layer
			seq++
			a.Add(e, seq, now)
		}
	}
	got := map[events.Layer]events.TokenRollup{}
	for _, u := range a.Advance(t0.Add(time.Hour)) {
		for _, r := range a.Rollups(u, nil) {
			if _, dup := got[r.Layer]; dup {
				t.Fatalf("two rollups of layer %q in one window", r.Layer)
			}
			got[r.Layer] = r
		}
		a.Release(u)
	}
	want := map[events.Layer]uint64{events.LayerGateway: 7, events.LayerEngine: 6, events.LayerApp: 4}
	if len(got) != len(want) {
		t.Fatalf("rollups by layer %v, want %v", len(got), want)
	}
	for layer, n := range want {
		if r := got[layer]; r.Requests != n || r.TTFT.Count != n {
			t.Errorf("layer %s: %d requests, %d TTFT samples; want %d", layer, r.Requests, r.TTFT.Count, n)
		}
	}
}

// TestWatermarkNeverGoesBack: after a quiet spell the watermark has moved on with the clock
// and windows behind it were closed (and a watermark published through them); the next
// event, however old, does not take it back, so events of those windows that come later are
// corrections, not ordinary windows opened behind a watermark already published.
func TestWatermarkNeverGoesBack(t *testing.T) {
	a := window.New(cfg(t), nil)
	a.Add(ev(0, events.StatusOK, 1, 2, 1, 2), 1, t0.Add(time.Second))
	quiet := t0.Add(5 * time.Minute) // no event for 5 minutes
	before := a.Watermark(quiet)
	if n := len(a.Advance(quiet)); n != 1 {
		t.Fatalf("the quiet stream closed %d windows", n)
	}
	// An event of a minute ago arrives, then one of the window after it.
	if r := a.Add(ev(4*time.Minute, events.StatusOK, 1, 2, 1, 2), 2, quiet); r != window.AddedLate {
		t.Fatalf("an event behind the watermark: %v, want a correction", r)
	}
	if wm := a.Watermark(quiet); wm.Before(before) {
		t.Fatalf("the watermark went back from %s to %s", before.Format(time.TimeOnly), wm.Format(time.TimeOnly))
	}
	// Its window (10:04:00, closed at 10:04:45) stays passed for the events after it.
	if r := a.Add(ev(4*time.Minute+5*time.Second, events.StatusOK, 1, 2, 1, 2), 3, quiet); r != window.AddedLate {
		t.Fatalf("the next event of a window behind the watermark: %v, want a correction", r)
	}
	// A window the watermark has not passed is an ordinary one.
	if r := a.Add(ev(4*time.Minute+15*time.Second, events.StatusOK, 1, 2, 1, 2), 4, quiet); r != window.Added {
		t.Fatalf("an event of a window still open: %v", r)
	}
}

// TestResumeClosesPublishedWindows: a process started after one that published a watermark
// through 10:04:00 takes every window ending at or before it as closed, however old the
// events that come first: they are corrections, not ordinary windows behind that watermark.
// Windows after it open as usual.
func TestResumeClosesPublishedWindows(t *testing.T) {
	a := window.New(cfg(t), nil)
	a.Resume(t0.Add(4 * time.Minute))
	for i, c := range []struct {
		at   time.Duration
		want window.Result
	}{
		{time.Minute, window.AddedLate},                                   // long closed
		{4*time.Minute - 15*time.Second, window.AddedLate},                // the window ending at the watermark
		{4 * time.Minute, window.Added},                                   // the next one
		{4*time.Minute - 14*time.Second, window.AddedLate},                // its window stays closed
		{4*time.Minute + 15*time.Second + time.Millisecond, window.Added}, // later ones open
	} {
		if r := a.Add(ev(c.at, events.StatusOK, 1, 2, 1, 2), uint64(i+1), t0.Add(4*time.Minute+20*time.Second)); r != c.want {
			t.Errorf("event at +%s: %v, want %v", c.at, r, c.want)
		}
	}
}
