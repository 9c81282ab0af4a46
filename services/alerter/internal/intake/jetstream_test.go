package intake

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/alerter/internal/checkpoint"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/notify"
)

func TestMain(m *testing.M) { testbed.Main(m) }

var limits = bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}

// bed is a NATS server with the ROLLUPS and ALERTS streams.
type bed struct {
	ctx context.Context
	nc  *nats.Conn
	js  jetstream.JetStream
}

func newBed(t *testing.T) *bed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	nc, js := testbed.JetStream(t)
	if err := bus.EnsureStreams(ctx, js, limits, events.StreamRollups, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	return &bed{ctx: ctx, nc: nc, js: js}
}

func (b *bed) consumer(t *testing.T) (jetstream.Consumer, uint64) {
	t.Helper()
	cons, replayed, err := ResumeConsumer(b.ctx, b.js, bus.ConsumerConfig{
		Stream: events.StreamRollups, Durable: "alerter", FilterSubject: events.SubjectRollupsAll,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute, MaxAckPending: 1000,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cons, replayed
}

func (b *bed) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := b.js.Consumer(b.ctx, events.StreamRollups, "alerter")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func (b *bed) publishToken(t *testing.T, start time.Time, model string) uint64 {
	t.Helper()
	data, err := json.Marshal(events.TokenRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow,
		Env: "prod", Scene: "chat", Model: model, Bucket: "0-499", Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	// Sent again, under one message id, when no acknowledgement comes: a publish that lands as
	// the stream is made again can go unanswered, and a publisher retries it.
	id := nuid.Next()
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ack, err := b.js.Publish(ctx, events.TokenRollupSubject("prod", "chat"), data, jetstream.WithMsgID(id))
		cancel()
		if err == nil {
			return ack.Sequence
		}
		if try == 5 || b.ctx.Err() != nil {
			t.Fatal(err)
		}
	}
}

func (b *bed) alertsHeld(t *testing.T) uint64 {
	t.Helper()
	s, err := b.js.Stream(b.ctx, events.StreamAlerts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// fetch reads n messages from cons.
func fetch(t *testing.T, cons jetstream.Consumer, n int) []jetstream.Msg {
	t.Helper()
	var out []jetstream.Msg
	deadline := time.Now().Add(10 * time.Second)
	for len(out) < n && time.Now().Before(deadline) {
		batch, err := cons.Fetch(n-len(out), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			out = append(out, m)
		}
	}
	if len(out) != n {
		t.Fatalf("fetched %d messages, want %d", len(out), n)
	}
	return out
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestResumeConsumerReadsUnackedWindowsFirst: the rollups of a window held unacknowledged at
// shutdown come again at once after a restart, in stream order, even when a later rollup
// of a window already evaluated sits above the ack floor; that one is acknowledged as
// redelivered, and its window is not evaluated a second time (partly, from the rollups
// above the floor alone).
func TestResumeConsumerReadsUnackedWindowsFirst(t *testing.T) {
	b := newBed(t)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w1 := w0.Add(15 * time.Second)
	cons, replayed := b.consumer(t)
	if replayed != 0 {
		t.Fatalf("a new consumer replays through %d", replayed)
	}
	s1 := b.publishToken(t, w1, "a") // w1 first: the GPU and token rollups of two windows interleave
	b.publishToken(t, w0, "a")
	s3 := b.publishToken(t, w1, "b")

	rec, cp := &recorder{}, &memCheckpoint{}
	in := New(cons, rec, &sink{}, cp, nil, Options{Settle: 2 * time.Second}, prometheus.NewRegistry(), discard)
	t0 := time.Now()
	ms := fetch(t, cons, 3)
	in.Add(ms[0], t0)
	in.Add(ms[1], t0)
	in.Add(ms[2], t0.Add(1500*time.Millisecond)) // w1 is still settling when w0 is done
	if n := in.Flush(b.ctx, t0.Add(2*time.Second)); n != 1 || len(cp.saved) != 1 || !cp.saved[0].Equal(w0) {
		t.Fatalf("delivered %d windows, checkpoints %v: want w0 only", n, cp.saved)
	}
	waitUntil(t, "w0's rollup acknowledged", func() bool { return b.info(t).NumAckPending == 2 })
	if f := b.info(t).AckFloor.Stream; f != 0 {
		t.Fatalf("ack floor %d, want 0 (seq %d is unacknowledged)", f, s1)
	}

	// Restart: a new intake on the consumer reset to its ack floor.
	cons, replayed = b.consumer(t)
	if replayed != s3 {
		t.Errorf("replayed through %d, want %d", replayed, s3)
	}
	rec2 := &recorder{}
	in2 := New(cons, rec2, &sink{}, &memCheckpoint{}, nil, Options{Settle: 2 * time.Second, Evaluated: cp.saved[0], Replayed: replayed},
		prometheus.NewRegistry(), discard)
	t1 := time.Now()
	for _, m := range fetch(t, cons, 3) {
		in2.Add(m, t1)
	}
	if n := in2.Flush(b.ctx, t1.Add(2*time.Second)); n != 1 {
		t.Fatalf("delivered %d windows after the restart, want 1", n)
	}
	if len(rec2.windows) != 1 || !rec2.windows[0].Start.Equal(w1) || len(rec2.windows[0].Tokens) != 2 {
		t.Fatalf("evaluated %+v, want w1 with its two rollups, and w0 not again", rec2.windows)
	}
	if got := testutil.ToFloat64(in2.skipped.WithLabelValues("redelivered")); got != 1 {
		t.Errorf("skipped{redelivered} = %v, want 1", got)
	}
	waitUntil(t, "every rollup acknowledged", func() bool {
		i := b.info(t)
		return i.NumAckPending == 0 && i.AckFloor.Stream == s3
	})
}

// gated evaluates every window to one firing alert, but only once released, so a test can
// begin shutdown while a window's evaluation is in flight.
type gated struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (g *gated) Evaluate(w engine.Window) []events.Alert {
	g.once.Do(func() { close(g.entered) })
	<-g.release
	return []events.Alert{firingAlert(w.Start)}
}

// TestShutdownDeliversWindowInFlight: shutdown that begins while a window is being evaluated
// lets it finish: its alert is published, its checkpoint saved and its rollup acknowledged,
// under the shutdown deadline rather than the cancelled context.
func TestShutdownDeliversWindowInFlight(t *testing.T) {
	b := newBed(t)
	cp, err := checkpoint.Open(b.ctx, b.js, "alerter", 1)
	if err != nil {
		t.Fatal(err)
	}
	cons, _ := b.consumer(t)
	reg := prometheus.NewRegistry()
	g := &gated{entered: make(chan struct{}), release: make(chan struct{})}
	in := New(cons, g, notify.New(b.js, nil, reg, discard), cp, b.nc,
		Options{Tick: 10 * time.Millisecond, ShutdownTimeout: 20 * time.Second}, reg, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()

	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	seq := b.publishToken(t, w0, "a")
	select {
	case <-g.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the window was not evaluated")
	}
	cancel()
	time.Sleep(100 * time.Millisecond) // shutdown is under way while the evaluation runs
	close(g.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}

	if n := b.alertsHeld(t); n != 1 {
		t.Errorf("ALERTS holds %d messages, want 1", n)
	}
	if i := b.info(t); i.NumAckPending != 0 || i.AckFloor.Stream != seq {
		t.Errorf("ack floor %d with %d unacknowledged, want %d and 0", i.AckFloor.Stream, i.NumAckPending, seq)
	}
	if got, err := cp.Load(b.ctx, time.Now()); err != nil || !got.Equal(w0) {
		t.Errorf("checkpoint %s (%v), want %s", got, err, w0)
	}
}

// TestShutdownLeavesUndeliveredWindowForRestart: a window whose alert cannot be published
// by the shutdown deadline is not acknowledged; the next start reads it again and delivers
// it, once.
func TestShutdownLeavesUndeliveredWindowForRestart(t *testing.T) {
	b := newBed(t)
	if err := b.js.DeleteStream(b.ctx, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	cons, _ := b.consumer(t)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	rec, cp := &recorder{raise: []events.Alert{firingAlert(w0)}}, &memCheckpoint{}
	reg := prometheus.NewRegistry()
	in := New(cons, rec, notify.New(b.js, nil, reg, discard), cp, b.nc,
		Options{Tick: 10 * time.Millisecond, ShutdownTimeout: 500 * time.Millisecond}, reg, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	seq := b.publishToken(t, w0, "a")
	waitUntil(t, "the window evaluated", func() bool { return testutil.ToFloat64(in.windows) == 1 })
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return by the shutdown deadline")
	}
	if i := b.info(t); i.NumAckPending != 1 || len(cp.saved) != 0 {
		t.Fatalf("%d unacknowledged, checkpoints %v: an unpublished window must stay unacknowledged", i.NumAckPending, cp.saved)
	}

	if err := bus.EnsureStreams(b.ctx, b.js, limits, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	cons, replayed := b.consumer(t)
	reg = prometheus.NewRegistry()
	in = New(cons, rec, notify.New(b.js, nil, reg, discard), cp, b.nc,
		Options{Tick: 10 * time.Millisecond, Replayed: replayed}, reg, discard)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- in.Run(ctx) }()
	waitUntil(t, "the window delivered after the restart", func() bool {
		i := b.info(t)
		return i.NumAckPending == 0 && i.AckFloor.Stream == seq
	})
	if n := b.alertsHeld(t); n != 1 {
		t.Errorf("ALERTS holds %d messages, want 1", n)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// syncRecorder is a recorder safe to read while Run evaluates.
type syncRecorder struct {
	mu      sync.Mutex
	windows []engine.Window
}

func (r *syncRecorder) Evaluate(w engine.Window) []events.Alert {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.windows = append(r.windows, w)
	return nil
}

// starts returns the windows evaluated, as "start:rollups".
func (r *syncRecorder) starts() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, w := range r.windows {
		out = append(out, w.Start.Format("15:04:05")+":"+strconv.Itoa(len(w.Tokens)))
	}
	return out
}

// TestConsumerMadeAgainWhenGone: the rollups consumer deleted while the intake runs (with a
// window still gathering), and later the ROLLUPS stream deleted: each time the stream and
// the consumer are made again and every rollup published since is evaluated, each window
// once and with each of its rollups once, and acknowledged. Before, the subscription ended
// with the consumer and the alerter read nothing more, alerting on nothing, until restarted.
func TestConsumerMadeAgainWhenGone(t *testing.T) {
	b := newBed(t)
	cfg := bus.ConsumerConfig{
		Stream: events.StreamRollups, Durable: "alerter", FilterSubject: events.SubjectRollupsAll,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute, MaxAckPending: 1000,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
	cons, _, err := ResumeConsumer(b.ctx, b.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	re, err := NewReopener(b.ctx, b.js, cfg, limits)
	if err != nil {
		t.Fatal(err)
	}
	rec := &syncRecorder{}
	reg := prometheus.NewRegistry()
	in := New(cons, rec, &sink{}, &memCheckpoint{}, nil,
		Options{Settle: 500 * time.Millisecond, Tick: 10 * time.Millisecond, Reopen: re.Reopen}, reg, discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	evaluated := func(want ...string) {
		t.Helper()
		waitUntil(t, "windows "+strings.Join(want, " ")+" evaluated", func() bool { return strings.Join(rec.starts(), " ") == strings.Join(want, " ") })
	}
	acked := func(last uint64) {
		t.Helper()
		waitUntil(t, "every rollup acknowledged", func() bool {
			i := b.info(t)
			return i.NumAckPending == 0 && i.AckFloor.Stream == last
		})
	}
	w := func(i int) time.Time { return time.Date(2026, 3, 3, 12, 0, 15*i, 0, time.UTC) }

	b.publishToken(t, w(0), "a")
	b.publishToken(t, w(1), "a") // w1 gathers while the consumer goes
	waitUntil(t, "w1 read", func() bool { return testutil.ToFloat64(in.received.WithLabelValues("tokens")) == 2 })
	if err := b.js.DeleteConsumer(b.ctx, events.StreamRollups, "alerter"); err != nil {
		t.Fatal(err)
	}
	b.publishToken(t, w(1), "b")
	last := b.publishToken(t, w(2), "a")
	evaluated("12:00:00:1", "12:00:15:2", "12:00:30:1")
	acked(last)
	if got := testutil.ToFloat64(in.gone); got != 1 {
		t.Errorf("consumer_gone_total = %v, want 1", got)
	}

	if err := b.js.DeleteStream(b.ctx, events.StreamRollups); err != nil {
		t.Fatal(err)
	}
	// The intake makes the stream again itself, as an aggregator starting would.
	waitUntil(t, "ROLLUPS made again and read", func() bool {
		_, err := b.js.Consumer(b.ctx, events.StreamRollups, "alerter")
		return err == nil && in.Reading()
	})
	b.publishToken(t, w(3), "a")
	last = b.publishToken(t, w(4), "a")
	evaluated("12:00:00:1", "12:00:15:2", "12:00:30:1", "12:00:45:1", "12:01:00:1")
	acked(last)
	if !in.Reading() {
		t.Error("not reading once the consumer is made again")
	}
}

// TestConsumerMadeAgainAfterStoreLost: NATS restarted without its store (a server whose
// data was not on a volume): the consumer and the ROLLUPS stream are gone, and the
// subscription, reconnected, gets no "consumer deleted", only pulls that go unanswered.
// The intake finds the consumer gone, makes the streams (ALERTS too) and the consumer
// again, and the rollups published on it from then on are evaluated.
func TestConsumerMadeAgainAfterStoreLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testbed.StartNATS(t, t.TempDir(), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js, limits, events.StreamRollups, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	b := &bed{ctx: ctx, nc: nc, js: js}
	cfg := bus.ConsumerConfig{
		Stream: events.StreamRollups, Durable: "alerter", FilterSubject: events.SubjectRollupsAll,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute, MaxAckPending: 1000,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
	cons, _, err := ResumeConsumer(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	re, err := NewReopener(ctx, js, cfg, limits, events.StreamAlerts)
	if err != nil {
		t.Fatal(err)
	}
	rec := &syncRecorder{}
	in := New(cons, rec, &sink{}, &memCheckpoint{}, nil,
		Options{Settle: 200 * time.Millisecond, Tick: 10 * time.Millisecond, Reopen: re.Reopen, AttemptTimeout: 2 * time.Second}, prometheus.NewRegistry(), discard)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(rctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	w := func(i int) time.Time { return time.Date(2026, 3, 3, 12, 0, 15*i, 0, time.UTC) }
	b.publishToken(t, w(0), "a")
	waitUntil(t, "w0 evaluated", func() bool { return len(rec.starts()) == 1 })

	srv.Shutdown()
	srv.WaitForShutdown()
	testbed.StartNATS(t, t.TempDir(), port) // the same address, an empty store
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := js.Stream(ctx, events.StreamRollups); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ROLLUPS was not made again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitUntil(t, "the consumer made again", func() bool {
		_, err := js.Consumer(ctx, events.StreamRollups, "alerter")
		return err == nil && in.Reading()
	})
	if _, err := js.Stream(ctx, events.StreamAlerts); err != nil {
		t.Errorf("ALERTS not made again: %v", err)
	}
	b.publishToken(t, w(1), "a")
	last := b.publishToken(t, w(2), "a")
	waitUntil(t, "w1 and w2 evaluated", func() bool { return strings.Join(rec.starts(), " ") == "12:00:00:1 12:00:15:1 12:00:30:1" })
	waitUntil(t, "every rollup acknowledged", func() bool {
		i := b.info(t)
		return i.NumAckPending == 0 && i.AckFloor.Stream == last
	})
}

// rollupsConsumerConfig is the intake's consumer of ROLLUPS as the alerter makes it.
func rollupsConsumerConfig() bus.ConsumerConfig {
	return bus.ConsumerConfig{
		Stream: events.StreamRollups, Durable: "alerter", FilterSubject: events.SubjectRollupsAll,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Minute, MaxAckPending: 1000,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
}

// TestConsumerMadeAgainBeforeAnythingRead: the consumer is deleted before the intake read
// any rollup (nothing seen, nothing held), and a rollup is published before it is made
// again (the reopen is held here until then, as a backoff or a slow NATS would). It is
// made again from where it started, and reads that rollup; before, it was made again as
// at start, DeliverNew, and the rollup was never read.
func TestConsumerMadeAgainBeforeAnythingRead(t *testing.T) {
	b := newBed(t)
	cfg := rollupsConsumerConfig()
	cons, _, err := ResumeConsumer(b.ctx, b.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	re, err := NewReopener(b.ctx, b.js, cfg, limits)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	reopen := func(ctx context.Context, from, seen uint64) (jetstream.Consumer, bool, error) {
		<-release
		return re.Reopen(ctx, from, seen)
	}
	rec := &syncRecorder{}
	in := New(cons, rec, &sink{}, &memCheckpoint{}, nil,
		Options{Settle: 200 * time.Millisecond, Tick: 10 * time.Millisecond, Reopen: reopen, AttemptTimeout: 5 * time.Second}, prometheus.NewRegistry(), discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond)
	if err := b.js.DeleteConsumer(b.ctx, events.StreamRollups, "alerter"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the consumer found gone", func() bool { return testutil.ToFloat64(in.gone) == 1 })
	b.publishToken(t, time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC), "a") // published while the consumer is gone
	close(release)
	waitUntil(t, "reading again", in.Reading)
	deadline := time.Now().Add(5 * time.Second)
	for len(rec.starts()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := rec.starts(); len(got) != 1 {
		t.Fatalf("windows evaluated %v, want the one whose rollup was published while the consumer was gone", got)
	}
}

// TestConsumerMadeAgainDeadLettersOnce: the consumer made again reads from the oldest
// rollup of the windows held, so a malformed rollup after it, dead-lettered and terminated
// already, is read again: it is terminated and counted redelivered, not dead-lettered a
// second time.
func TestConsumerMadeAgainDeadLettersOnce(t *testing.T) {
	b := newBed(t)
	cfg := rollupsConsumerConfig()
	cons, _, err := ResumeConsumer(b.ctx, b.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	re, err := NewReopener(b.ctx, b.js, cfg, limits)
	if err != nil {
		t.Fatal(err)
	}
	var dead atomic.Int64
	sub, err := b.nc.Subscribe(events.SubjectInvalid, func(*nats.Msg) { dead.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	rec := &syncRecorder{}
	in := New(cons, rec, &sink{}, &memCheckpoint{}, b.nc,
		Options{Settle: 3 * time.Second, Tick: 10 * time.Millisecond, Reopen: re.Reopen}, prometheus.NewRegistry(), discard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	defer func() { cancel(); <-done }()
	b.publishToken(t, time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC), "a") // a window held
	if _, err := b.js.Publish(b.ctx, "rollup.tokens.prod", []byte("{")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the malformed rollup dead-lettered", func() bool { return dead.Load() == 1 })
	if err := b.js.DeleteConsumer(b.ctx, events.StreamRollups, "alerter"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "window evaluated", func() bool { return len(rec.starts()) == 1 })
	time.Sleep(300 * time.Millisecond)
	if n := dead.Load(); n != 1 {
		t.Errorf("the malformed rollup was dead-lettered %d times, want once", n)
	}
	if got := testutil.ToFloat64(in.skipped.WithLabelValues(reasonRedelivered)); got != 2 {
		t.Errorf("skipped{reason=redelivered} = %v, want 2: the rollup held and the malformed one, read again", got)
	}
}
