package intake

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
)

// windowLog records the windows evaluated, for a test reading it while Run goes on.
type windowLog struct {
	mu      sync.Mutex
	windows []engine.Window
}

func (l *windowLog) Evaluate(w engine.Window) []events.Alert {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.windows = append(l.windows, w)
	return nil
}

func (l *windowLog) get() []engine.Window {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]engine.Window(nil), l.windows...)
}

func (b *bed) publishWatermark(t *testing.T, consumer string, through time.Time) {
	t.Helper()
	data, err := json.Marshal(events.Watermark{V: 1, Consumer: consumer, Through: through, WindowSeconds: 15, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(b.ctx, events.WatermarkSubject(consumer), data); err != nil {
		t.Fatal(err)
	}
}

// TestLaggingAggregatorWaitedFor: two partitioned aggregators publish their rollups and
// watermarks on the real ROLLUPS stream. While one is paused a window waits for it, past its
// settle time, and is evaluated with both partitions' rollups once it catches up; when it
// stays away the next window is evaluated after ALERTER_WATERMARK_TIMEOUT, counted, the
// windows after that no longer wait for it, and its rollup of the timed-out window is late.
// Without watermarks the first window was evaluated on its settle time with one partition.
func TestLaggingAggregatorWaitedFor(t *testing.T) {
	b := newBed(t)
	cons, _ := b.consumer(t)
	log := &windowLog{}
	reg := prometheus.NewRegistry()
	const timeout = 4 * time.Second
	in := New(cons, log, &sink{}, &memCheckpoint{}, nil,
		Options{Settle: 200 * time.Millisecond, WatermarkTimeout: timeout, Tick: 20 * time.Millisecond}, reg, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w1, w2, w3 := w0.Add(15*time.Second), w0.Add(30*time.Second), w0.Add(45*time.Second)
	b.publishWatermark(t, "agg-b", w0) // agg-b is known, and has not closed w0
	b.publishToken(t, w0, "a")
	b.publishWatermark(t, "agg-a", w1)
	time.Sleep(time.Second) // five settle times
	if got := log.get(); len(got) != 0 {
		t.Fatalf("evaluated %d windows while agg-b had not passed w0", len(got))
	}
	b.publishToken(t, w0, "b") // agg-b catches up
	b.publishWatermark(t, "agg-b", w1)
	waitUntil(t, "w0 evaluated", func() bool { return len(log.get()) == 1 })
	if got := log.get()[0]; !got.Start.Equal(w0) || len(got.Tokens) != 2 {
		t.Fatalf("evaluated %s with %d rollups, want w0 with both partitions' 2", got.Start, len(got.Tokens))
	}

	// agg-b stays away: w1 waits for it, then goes on without it.
	began := time.Now()
	b.publishToken(t, w1, "a")
	b.publishWatermark(t, "agg-a", w2)
	deadline := time.Now().Add(timeout + 10*time.Second)
	for len(log.get()) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := log.get(); len(got) != 2 || !got[1].Start.Equal(w1) || len(got[1].Tokens) != 1 {
		t.Fatalf("evaluated %+v, want w1 with agg-a's rollup", got)
	}
	if waited := time.Since(began); waited < timeout {
		t.Errorf("w1 evaluated after %s, before the %s timeout", waited, timeout)
	}
	if got := testutil.ToFloat64(in.wm.timeouts); got != 1 {
		t.Errorf("watermark_timeouts_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(in.wm.lagging); got != 1 {
		t.Errorf("aggregators_lagging = %v, want 1", got)
	}

	// The next window does not wait for the lagging aggregator again.
	began = time.Now()
	b.publishToken(t, w2, "a")
	b.publishWatermark(t, "agg-a", w3)
	waitUntil(t, "w2 evaluated", func() bool { return len(log.get()) == 3 })
	if waited := time.Since(began); waited >= timeout {
		t.Errorf("w2 waited %s for an aggregator that timed out", waited)
	}

	// agg-b comes back: its rollup of w1 is late; its watermark moving makes windows wait again.
	b.publishToken(t, w1, "b")
	b.publishWatermark(t, "agg-b", w2)
	waitUntil(t, "agg-b waited for again", func() bool { return testutil.ToFloat64(in.wm.lagging) == 0 })
	if got := testutil.ToFloat64(in.skipped.WithLabelValues(reasonLate)); got != 1 {
		t.Errorf("skipped{late} = %v, want 1", got)
	}
	b.publishToken(t, w3, "a")
	b.publishWatermark(t, "agg-a", w3.Add(15*time.Second))
	time.Sleep(time.Second)
	if got := log.get(); len(got) != 3 {
		t.Fatalf("evaluated w3 while agg-b, waited for again, had not passed it")
	}
	if got := testutil.ToFloat64(in.wm.received); got != 7 {
		t.Errorf("watermarks_received_total = %v, want 7", got)
	}
}

// TestWatermarkFromTheFarFuture: a watermark far ahead of the clock is dead-lettered. Taken,
// it would stand for its aggregator for good (a watermark never goes back), and windows
// would no longer wait for the aggregator's real one.
func TestWatermarkFromTheFarFuture(t *testing.T) {
	rec, dl := &recorder{}, &dead{}
	in := New(nil, rec, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second, WatermarkTimeout: time.Minute}, prometheus.NewRegistry(), discard)
	now := time.Date(2026, 3, 3, 12, 0, 20, 0, time.UTC)
	w0 := now.Add(-20 * time.Second)
	wm := func(through time.Time) *msg {
		data, err := json.Marshal(events.Watermark{V: 1, Consumer: "agg-b", Through: through, WindowSeconds: 15, At: now})
		if err != nil {
			t.Fatal(err)
		}
		return &msg{subject: events.WatermarkSubject("agg-b"), data: data}
	}
	future, real := wm(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)), wm(w0)
	in.Add(future, now)
	in.Add(real, now)
	if !future.termd || real.termd || len(dl.msgs) != 1 || dl.msgs[0].Header.Get("Tokenscope-Reason") != "invalid" {
		t.Fatalf("future terminated %v, real terminated %v, dead letters %+v", future.termd, real.termd, dl.msgs)
	}
	in.Add(tokenMsg(t, w0, events.KindWindow), now)
	if n := in.Flush(context.Background(), now.Add(2*time.Second)); n != 0 {
		t.Fatalf("evaluated %d windows that agg-b's watermark has not passed", n)
	}
}
