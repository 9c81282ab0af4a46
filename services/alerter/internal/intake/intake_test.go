package intake

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
)

// msg is a rollup message; only what the intake calls is implemented. seq 0 stands for
// a message without JetStream metadata.
type msg struct {
	jetstream.Msg
	subject      string
	data         []byte
	seq          uint64
	delivered    uint64
	id           string // Nats-Msg-Id, if any
	acked, termd bool
}

func (m *msg) Headers() nats.Header {
	if m.id == "" {
		return nil
	}
	return nats.Header{jetstream.MsgIDHeader: []string{m.id}}
}

func (m *msg) Subject() string { return m.subject }
func (m *msg) Data() []byte    { return m.data }
func (m *msg) Ack() error      { m.acked = true; return nil }
func (m *msg) Term() error     { m.termd = true; return nil }
func (m *msg) Metadata() (*jetstream.MsgMetadata, error) {
	if m.seq == 0 {
		return nil, errors.New("not a JetStream message")
	}
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}, NumDelivered: max(m.delivered, 1)}, nil
}

// at returns a copy of m at stream sequence seq, delivered n times.
func (m *msg) at(seq, n uint64) *msg {
	return &msg{subject: m.subject, data: m.data, seq: seq, delivered: n, id: m.id}
}

// recorder evaluates every window to the alerts in raise, if any.
type recorder struct {
	windows []engine.Window
	raise   []events.Alert
}

func (r *recorder) Evaluate(w engine.Window) []events.Alert {
	r.windows = append(r.windows, w)
	return r.raise
}

type sink struct {
	publishes  int
	publishErr error
	published  []events.Alert
}

func (s *sink) Publish(_ context.Context, alerts []events.Alert) error {
	s.publishes++
	if s.publishErr != nil {
		return s.publishErr
	}
	s.published = append(s.published, alerts...)
	return nil
}

type memCheckpoint struct {
	saved []time.Time
	err   error
}

func (c *memCheckpoint) Save(_ context.Context, t time.Time) error {
	if c.err != nil {
		return c.err
	}
	c.saved = append(c.saved, t)
	return nil
}

type dead struct{ msgs []*nats.Msg }

func (d *dead) PublishMsg(m *nats.Msg) error { d.msgs = append(d.msgs, m); return nil }

// limitedDead is a dead-letter subject on a server with a payload limit.
type limitedDead struct {
	dead
	max int64
}

func (d *limitedDead) MaxPayload() int64 { return d.max }

// TestDeadLetterOverThePayloadLimit: a dead letter that its headers would put over the
// server's payload limit keeps its reason and as much of the data as fits.
func TestDeadLetterOverThePayloadLimit(t *testing.T) {
	dl := &limitedDead{max: 1024}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	bad := &msg{subject: "rollup.tokens.prod.chat", data: []byte(`{"v":1,"scene":"` + strings.Repeat("x", 1000))}
	small := &msg{subject: "rollup.tokens.prod.chat", data: []byte(`{"v":1,`)}
	in.Add(bad, time.Now())
	in.Add(small, time.Now())
	if len(dl.msgs) != 2 {
		t.Fatalf("%d dead letters", len(dl.msgs))
	}
	m := dl.msgs[0]
	size := len("NATS/1.0\r\n\r\n") + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	if size > 1024 || m.Header.Get("Tokenscope-Reason") != "malformed" || m.Header.Get("Tokenscope-Truncated") != strconv.Itoa(len(bad.data)) ||
		!bytes.HasPrefix(bad.data, m.Data) || len(m.Data) < 700 {
		t.Fatalf("dead letter of %d bytes, headers %v, %d bytes of data", size, m.Header, len(m.Data))
	}
	if m := dl.msgs[1]; string(m.Data) != string(small.data) || m.Header.Get("Tokenscope-Truncated") != "" {
		t.Fatalf("small dead letter: %q %v", m.Data, m.Header)
	}
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func tokenMsg(t *testing.T, start time.Time, kind string) *msg {
	t.Helper()
	data, err := json.Marshal(events.TokenRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: kind, Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499", Requests: 10})
	if err != nil {
		t.Fatal(err)
	}
	return &msg{subject: "rollup.tokens.prod.chat", data: data}
}

func gpuMsg(t *testing.T, start time.Time) *msg {
	t.Helper()
	data, _ := json.Marshal(events.GPURollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow, Host: "h", UtilAvg: 50})
	return &msg{subject: "rollup.gpu.h", data: data}
}

func TestWindowsEvaluatedInOrderAfterSettling(t *testing.T) {
	rec, sk, cp, dl := &recorder{}, &sink{}, &memCheckpoint{}, &dead{}
	reg := prometheus.NewRegistry()
	in := New(nil, rec, sk, cp, dl, Options{Settle: 2 * time.Second}, reg, discard)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w1 := w0.Add(15 * time.Second)
	arrive := time.Date(2026, 3, 3, 12, 0, 20, 0, time.UTC)
	m1, m2, m3 := tokenMsg(t, w1, events.KindWindow), tokenMsg(t, w0, events.KindWindow), gpuMsg(t, w0)
	in.Add(m1, arrive)
	in.Add(m2, arrive)
	in.Add(m3, arrive.Add(time.Second))
	if n := in.Flush(context.Background(), arrive.Add(time.Second)); n != 0 {
		t.Fatalf("evaluated %d windows before they settled", n)
	}
	if m1.acked || m2.acked {
		t.Fatal("acked before evaluation")
	}
	// w0's last rollup came a second later: at arrive+2.5s neither may go (w1 waits for w0).
	if n := in.Flush(context.Background(), arrive.Add(2500*time.Millisecond)); n != 0 {
		t.Fatalf("evaluated %d windows out of order", n)
	}
	if n := in.Flush(context.Background(), arrive.Add(3*time.Second)); n != 2 {
		t.Fatalf("evaluated %d windows, want 2", n)
	}
	if len(rec.windows) != 2 || !rec.windows[0].Start.Equal(w0) || len(rec.windows[0].GPUs) != 1 || len(rec.windows[1].Tokens) != 1 {
		t.Fatalf("windows %+v", rec.windows)
	}
	if !m1.acked || !m2.acked || !m3.acked || sk.publishes != 2 {
		t.Error("messages must be acked once their window is evaluated and delivered")
	}
	if len(cp.saved) != 2 || !cp.saved[0].Equal(w0) || !cp.saved[1].Equal(w1) {
		t.Errorf("checkpoints %v, want %s then %s", cp.saved, w0, w1)
	}

	// A rollup for a window already evaluated is late; a correction is not evaluated;
	// garbage is terminated and dead-lettered with its reason.
	late, corr := tokenMsg(t, w0, events.KindWindow), tokenMsg(t, w1.Add(15*time.Second), events.KindCorrection)
	bad := &msg{subject: "rollup.tokens.prod.chat", data: []byte(`{"v":1,`)}
	invalid := tokenMsg(t, w1.Add(15*time.Second), "sideways")
	for _, m := range []*msg{late, corr, bad, invalid} {
		in.Add(m, arrive.Add(time.Minute))
	}
	if !late.acked || !corr.acked || !bad.termd || !invalid.termd || in.Pending() != 0 {
		t.Errorf("late %v corr %v bad %v invalid %v pending %d", late.acked, corr.acked, bad.termd, invalid.termd, in.Pending())
	}
	if len(dl.msgs) != 2 || dl.msgs[0].Subject != events.SubjectInvalid || dl.msgs[0].Header.Get("Tokenscope-Reason") != "malformed" || dl.msgs[1].Header.Get("Tokenscope-Reason") != "invalid" {
		t.Errorf("dead letters %+v", dl.msgs)
	}
	for reason, want := range map[string]float64{"late": 1, "correction": 1, "malformed": 1, "invalid": 1} {
		if got := testutil.ToFloat64(in.skipped.WithLabelValues(reason)); got != want {
			t.Errorf("skipped{%s} = %v, want %v", reason, got, want)
		}
	}
}

func firingAlert(window time.Time) events.Alert {
	return events.Alert{V: 1, Fingerprint: "f1", Rule: "ttft_p95_dynamic", State: events.AlertFiring, Severity: "warning",
		WindowStart: window, At: window.Add(15 * time.Second)}
}

// TestWindowHeldUntilAlertsPublished: a window whose alerts JetStream did not take keeps its
// rollups unacknowledged and is retried with backoff, without being evaluated again, and no
// later window is evaluated before it is delivered.
func TestWindowHeldUntilAlertsPublished(t *testing.T) {
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w1 := w0.Add(15 * time.Second)
	rec := &recorder{raise: []events.Alert{firingAlert(w0)}}
	sk, cp := &sink{publishErr: errors.New("no responders")}, &memCheckpoint{}
	in := New(nil, rec, sk, cp, nil, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	t0 := time.Date(2026, 3, 3, 12, 0, 20, 0, time.UTC)
	m0, m1 := tokenMsg(t, w0, events.KindWindow).at(1, 1), tokenMsg(t, w1, events.KindWindow).at(2, 1)
	in.Add(m0, t0)
	in.Add(m1, t0)
	if n := in.Flush(context.Background(), t0.Add(2*time.Second)); n != 0 {
		t.Fatalf("delivered %d windows while publishing fails", n)
	}
	if m0.acked || len(cp.saved) != 0 || len(rec.windows) != 1 {
		t.Fatalf("acked %v, checkpoints %v, evaluated %d: the window must be held, not acknowledged", m0.acked, cp.saved, len(rec.windows))
	}
	if got := testutil.ToFloat64(in.heldGauge); got != 1 {
		t.Errorf("windows_undelivered = %v, want 1", got)
	}
	// A copy delivered again (AckWait ran out) joins the held window; it is not acked yet.
	again := m0.at(1, 2)
	in.Add(again, t0.Add(3*time.Second))
	if again.acked {
		t.Fatal("a copy of a held window's rollup was acknowledged before the window was delivered")
	}
	sk.publishErr = nil
	if n := in.Flush(context.Background(), t0.Add(2*time.Second+100*time.Millisecond)); n != 0 || sk.publishes != 1 {
		t.Fatalf("retried before the backoff: %d delivered, %d publishes", n, sk.publishes)
	}
	if n := in.Flush(context.Background(), t0.Add(5*time.Second)); n != 2 {
		t.Fatalf("delivered %d windows, want 2", n)
	}
	if len(rec.windows) != 2 || !rec.windows[0].Start.Equal(w0) || !rec.windows[1].Start.Equal(w1) {
		t.Fatalf("evaluated %d windows, want w0 once then w1", len(rec.windows))
	}
	if !again.acked || !m1.acked || len(sk.published) != 2 {
		t.Errorf("acked copy %v, w1 %v; published %d", again.acked, m1.acked, len(sk.published))
	}
	if len(cp.saved) != 2 || !cp.saved[0].Equal(w0) {
		t.Errorf("checkpoints %v", cp.saved)
	}
	if got := testutil.ToFloat64(in.skipped.WithLabelValues("redelivered")); got != 1 {
		t.Errorf("skipped{redelivered} = %v, want 1", got)
	}
}

// TestWindowHeldUntilCheckpointSaved: rollups are acknowledged only after the checkpoint
// that says their window is done; the alerts are not published twice meanwhile.
func TestWindowHeldUntilCheckpointSaved(t *testing.T) {
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	rec := &recorder{raise: []events.Alert{firingAlert(w0)}}
	sk, cp := &sink{}, &memCheckpoint{err: errors.New("KV away")}
	in := New(nil, rec, sk, cp, nil, Options{}, prometheus.NewRegistry(), discard)
	t0 := time.Date(2026, 3, 3, 12, 0, 20, 0, time.UTC)
	m0 := tokenMsg(t, w0, events.KindWindow).at(1, 1)
	in.Add(m0, t0)
	if n := in.Flush(context.Background(), t0); n != 0 || m0.acked {
		t.Fatalf("delivered %d, acked %v without a checkpoint", n, m0.acked)
	}
	cp.err = nil
	if n := in.Flush(context.Background(), t0.Add(time.Minute)); n != 1 || !m0.acked {
		t.Fatalf("delivered %d, acked %v", n, m0.acked)
	}
	if sk.publishes != 1 || len(rec.windows) != 1 || testutil.ToFloat64(in.cpErrors) != 1 {
		t.Errorf("publishes %d evaluations %d checkpoint errors %v", sk.publishes, len(rec.windows), testutil.ToFloat64(in.cpErrors))
	}
}

// TestRollupsOfEvaluatedWindowsAfterRestart: after a restart, the rollups read again from
// the ack floor whose window the checkpoint covers are acknowledged as redelivered without a
// second evaluation; a rollup of such a window first delivered now is late; the rest make
// windows, each rollup once however often it is delivered.
func TestRollupsOfEvaluatedWindowsAfterRestart(t *testing.T) {
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w1, w2 := w0.Add(15*time.Second), w0.Add(30*time.Second)
	rec := &recorder{}
	in := New(nil, rec, &sink{}, &memCheckpoint{}, nil, Options{Evaluated: w1, Replayed: 5}, prometheus.NewRegistry(), discard)
	t0 := time.Date(2026, 3, 3, 12, 1, 0, 0, time.UTC)
	old0, old1 := tokenMsg(t, w0, events.KindWindow).at(3, 1), gpuMsg(t, w1).at(4, 1)
	new2 := tokenMsg(t, w2, events.KindWindow).at(5, 1)
	late := tokenMsg(t, w1, events.KindWindow).at(6, 1)
	for _, m := range []*msg{old0, old1, new2, new2.at(5, 2), late} {
		in.Add(m, t0)
	}
	if !old0.acked || !old1.acked || !late.acked || new2.acked {
		t.Fatalf("acked: w0 %v, w1 %v, late %v, w2 %v", old0.acked, old1.acked, late.acked, new2.acked)
	}
	for reason, want := range map[string]float64{"redelivered": 3, "late": 1} {
		if got := testutil.ToFloat64(in.skipped.WithLabelValues(reason)); got != want {
			t.Errorf("skipped{%s} = %v, want %v", reason, got, want)
		}
	}
	if n := in.Flush(context.Background(), t0); n != 1 || len(rec.windows) != 1 || !rec.windows[0].Start.Equal(w2) || len(rec.windows[0].Tokens) != 1 {
		t.Fatalf("delivered %d, evaluated %+v: want w2 once with one rollup", n, rec.windows)
	}
}

// TestRollupStoredTwiceCountsOnce: an aggregator started again after a kill publishes again,
// under the same Nats-Msg-Id, the rollups of a flush whose acknowledgement it had not
// recorded; past the stream's duplicate window JetStream stores the copy at a new sequence.
// The copy is counted once in its window, acknowledged with it, and counted as duplicate;
// rollups without an id are never taken for copies of each other.
func TestRollupStoredTwiceCountsOnce(t *testing.T) {
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	rec := &recorder{}
	in := New(nil, rec, &sink{}, &memCheckpoint{}, nil, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	t0 := w0.Add(20 * time.Second)
	a, b := tokenMsg(t, w0, events.KindWindow).at(3, 1), tokenMsg(t, w0, events.KindWindow).at(4, 1)
	a.id, b.id = "f1-0", "f1-1"
	g := gpuMsg(t, w0).at(5, 1)
	g.id = "f2-0"
	copyA, copyG := a.at(9, 1), g.at(10, 1)
	plain1, plain2 := tokenMsg(t, w0, events.KindWindow).at(11, 1), tokenMsg(t, w0, events.KindWindow).at(12, 1)
	all := []*msg{a, b, g, copyA, copyG, plain1, plain2}
	for _, m := range all {
		in.Add(m, t0)
	}
	if n := in.Flush(context.Background(), t0.Add(time.Second)); n != 1 || len(rec.windows) != 1 {
		t.Fatalf("delivered %d windows, want 1", n)
	}
	if w := rec.windows[0]; len(w.Tokens) != 4 || len(w.GPUs) != 1 {
		t.Errorf("evaluated %d token and %d GPU rollups, want 4 and 1: a copy counted twice", len(w.Tokens), len(w.GPUs))
	}
	for i, m := range all {
		if !m.acked {
			t.Errorf("message %d not acknowledged with its window", i)
		}
	}
	if got := testutil.ToFloat64(in.skipped.WithLabelValues("duplicate")); got != 2 {
		t.Errorf("skipped{duplicate} = %v, want 2", got)
	}
	// A copy that comes once its window is evaluated is late, as any rollup then.
	late := b.at(13, 1)
	in.Add(late, t0.Add(2*time.Second))
	if !late.acked || testutil.ToFloat64(in.skipped.WithLabelValues("late")) != 1 {
		t.Errorf("a copy after its window: acked %v, late %v", late.acked, testutil.ToFloat64(in.skipped.WithLabelValues("late")))
	}
}

// TestRollupLayers takes a rollup of each layer, and one without (an older aggregator's,
// the gateway's), and dead-letters one of a layer that does not exist.
func TestRollupLayers(t *testing.T) {
	dl := &dead{}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	for _, layer := range []string{"", "gateway", "engine", "app", "edge"} {
		m := tokenMsg(t, w0, events.KindWindow)
		if layer == "" {
			m.data = []byte(strings.Replace(string(m.data), `"layer":"",`, ``, 1))
		} else {
			m.data = []byte(strings.Replace(string(m.data), `"layer":""`, `"layer":"`+layer+`"`, 1))
		}
		in.Add(m, w0.Add(20*time.Second))
		if m.termd != (layer == "edge") {
			t.Errorf("layer %q: terminated %v", layer, m.termd)
		}
	}
	if len(dl.msgs) != 1 || dl.msgs[0].Header.Get("Tokenscope-Reason") != "invalid" || !strings.Contains(string(dl.msgs[0].Data), `"layer":"edge"`) {
		t.Fatalf("dead letters %+v", dl.msgs)
	}
}

// Engine rollups join their window; invalid ones are dead-lettered with their reason.
func TestEngineRollupsJoinTheirWindow(t *testing.T) {
	rec, dl := &recorder{}, &dead{}
	reg := prometheus.NewRegistry()
	in := New(nil, rec, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, reg, discard)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	eng := func(r events.EngineRollup) *msg {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return &msg{subject: "rollup.engine.gpu1", data: data}
	}
	good := events.EngineRollup{V: 1, WindowStart: w0, WindowSeconds: 15, Kind: events.KindWindow, Host: "gpu1", Engine: "vllm", Name: "vllm", Model: "m",
		Samples: 15, UpSamples: 15, QueueDepthAvg: 3, KVCacheUsageAvg: 0.5}
	bad := good
	bad.KVCacheUsageAvg = 1.5
	miscounted := good
	miscounted.DownSamples = 3
	noName := good
	noName.Name = ""
	msgs := []*msg{eng(good), tokenMsg(t, w0, events.KindWindow), eng(bad), eng(miscounted), eng(noName), {subject: "rollup.engine.gpu1", data: []byte("{")}}
	for _, m := range msgs {
		in.Add(m, w0.Add(20*time.Second))
	}
	if n := in.Flush(context.Background(), w0.Add(time.Minute)); n != 1 {
		t.Fatalf("evaluated %d windows", n)
	}
	if w := rec.windows[0]; len(w.Engines) != 1 || len(w.Tokens) != 1 || w.Engines[0].QueueDepthAvg != 3 {
		t.Fatalf("window %+v", w)
	}
	if len(dl.msgs) != 4 {
		t.Fatalf("%d dead letters, want 4", len(dl.msgs))
	}
	for i, want := range []string{"invalid", "invalid", "invalid", "malformed"} {
		if got := dl.msgs[i].Header.Get("Tokenscope-Reason"); got != want || !msgs[i+2].termd {
			t.Errorf("dead letter %d: reason %q (%s), want %s", i, got, dl.msgs[i].Header.Get("Tokenscope-Error"), want)
		}
	}
	if got := testutil.ToFloat64(in.received.WithLabelValues("engine")); got != 5 {
		t.Errorf("received{engine} = %v, want 5", got)
	}
}

// TestRollupFromTheFarFuture: a rollup whose window starts far ahead of the clock (a
// hostile publisher, a clock years off) is dead-lettered, not evaluated: evaluated, it
// would make every real window after it late, and its checkpoint would keep them late
// after a restart.
func TestRollupFromTheFarFuture(t *testing.T) {
	rec, sk, cp, dl := &recorder{}, &sink{}, &memCheckpoint{}, &dead{}
	in := New(nil, rec, sk, cp, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	now := time.Date(2026, 3, 3, 12, 0, 15, 0, time.UTC)
	w0 := now.Add(-15 * time.Second)
	future := tokenMsg(t, time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), events.KindWindow)
	ahead := tokenMsg(t, now.Add(time.Hour), events.KindWindow)
	near := tokenMsg(t, now.Add(5*time.Minute), events.KindWindow) // a clock a few minutes ahead
	in.Add(future, now)
	in.Add(ahead, now)
	in.Add(near, now)
	if !future.termd || !ahead.termd || near.termd {
		t.Fatalf("terminated: 9999 %v, an hour ahead %v, 5 minutes ahead %v", future.termd, ahead.termd, near.termd)
	}
	if len(dl.msgs) != 2 || dl.msgs[0].Header.Get("Tokenscope-Reason") != "invalid" || !strings.Contains(dl.msgs[0].Header.Get("Tokenscope-Error"), "ahead") {
		t.Fatalf("dead letters %+v", dl.msgs)
	}
	in.Add(tokenMsg(t, w0, events.KindWindow), now)
	in.Flush(context.Background(), now.Add(2*time.Second))
	if len(rec.windows) != 2 || !rec.windows[0].Start.Equal(w0) || !rec.windows[1].Start.Equal(now.Add(5*time.Minute)) {
		t.Fatalf("evaluated %+v, want the windows at %s and 5 minutes ahead", rec.windows, w0)
	}
	if got := testutil.ToFloat64(in.skipped.WithLabelValues("invalid")); got != 2 {
		t.Errorf("skipped{invalid} = %v, want 2", got)
	}
}

// TestHostRollupsNotEvaluated: host rollups, which no rule reads, are acknowledged and
// counted as such, not as an unknown subject (which says something publishes where it
// should not).
func TestHostRollupsNotEvaluated(t *testing.T) {
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, &dead{}, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	host := &msg{subject: "rollup.host.gpu-node-3", data: []byte(`{"v":1}`)}
	other := &msg{subject: "rollup.elsewhere.x", data: []byte(`{}`)}
	in.Add(host, time.Now())
	in.Add(other, time.Now())
	if !host.acked || !other.acked || in.Pending() != 0 {
		t.Fatalf("host acked %v, other acked %v, %d pending", host.acked, other.acked, in.Pending())
	}
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"received{host}", testutil.ToFloat64(in.received.WithLabelValues("host")), 1},
		{"skipped{not_evaluated}", testutil.ToFloat64(in.skipped.WithLabelValues("not_evaluated")), 1},
		{"skipped{unknown_subject}", testutil.ToFloat64(in.skipped.WithLabelValues("unknown_subject")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestRollupKeysExact: a rollup with a field given twice, or in other letter case, is
// malformed and dead-lettered: encoding/json would take the last of them, case-insensitively,
// where the schema and other readers see another message.
func TestRollupKeysExact(t *testing.T) {
	dl := &dead{}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	good := tokenMsg(t, time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC), events.KindWindow)
	twice := &msg{subject: good.subject, data: []byte(strings.Replace(string(good.data), `"requests":10`, `"requests":10,"requests":1000000`, 1))}
	cased := &msg{subject: good.subject, data: []byte(strings.Replace(string(good.data), `"requests":10`, `"requests":10,"Requests":1000000`, 1))}
	now := time.Date(2026, 3, 3, 12, 0, 20, 0, time.UTC)
	for _, m := range []*msg{good, twice, cased} {
		in.Add(m, now)
	}
	if good.termd || !twice.termd || !cased.termd || len(dl.msgs) != 2 || dl.msgs[0].Header.Get("Tokenscope-Reason") != "malformed" {
		t.Fatalf("terminated: good %v, twice %v, cased %v; dead letters %+v", good.termd, twice.termd, cased.termd, dl.msgs)
	}
}

// TestRollupWindowSecondsBounded: a rollup whose window_seconds is beyond a day is invalid:
// it would stretch its window for every rollup of it (rates per second of every host near
// zero, the window's end past any time).
func TestRollupWindowSecondsBounded(t *testing.T) {
	dl := &dead{}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	start := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := start.Add(20 * time.Second)
	seconds := map[string]int{"tokens": 1e12, "gpu": 86401, "engine": 1e12, "feedback": 1e12}
	for _, kind := range []string{"tokens", "gpu", "engine", "feedback"} {
		m := &msg{subject: "rollup." + kind + ".x.y", data: rollupOf(t, kind, 1, start, seconds[kind])}
		in.Add(m, now)
		if !m.termd {
			t.Errorf("%s rollup of window_seconds beyond a day taken", kind)
		}
	}
	day := tokenMsg(t, start, events.KindWindow)
	in.Add(day, now)
	if day.termd || len(dl.msgs) != 4 {
		t.Fatalf("a 15 s window terminated %v; %d dead letters", day.termd, len(dl.msgs))
	}
}

// rollupOf is a window rollup of kind (tokens, gpu, engine or feedback) of version v, over
// the window of seconds from start, that carries only what the kind requires.
func rollupOf(t *testing.T, kind string, v int, start time.Time, seconds int) []byte {
	t.Helper()
	var r any
	switch kind {
	case "tokens":
		r = events.TokenRollup{V: v, WindowStart: start, WindowSeconds: seconds, Kind: events.KindWindow, Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499", Requests: 1}
	case "gpu":
		r = events.GPURollup{V: v, WindowStart: start, WindowSeconds: seconds, Kind: events.KindWindow, Host: "h"}
	case "engine":
		r = events.EngineRollup{V: v, WindowStart: start, WindowSeconds: seconds, Kind: events.KindWindow, Host: "h", Name: "vllm"}
	default:
		r = events.FeedbackRollup{V: v, WindowStart: start, WindowSeconds: seconds, Kind: events.KindWindow, Name: "thumbs"}
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestRollupLabelsBounded: a label longer than the event contract allows (which no
// aggregator writes) makes a rollup invalid, dead-lettered with its field named, in every
// kind of rollup; one at the limit is taken.
func TestRollupLabelsBounded(t *testing.T) {
	dl := &dead{}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	start := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := start.Add(20 * time.Second)
	long, limit := strings.Repeat("x", events.MaxLabelLen+1), strings.Repeat("x", events.MaxLabelLen)
	rollup := func(kind, label string) any {
		switch kind {
		case "tokens":
			return events.TokenRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow, Env: "prod", Scene: "chat", Model: label, Bucket: "0-499", Requests: 1}
		case "gpu":
			return events.GPURollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow, Host: label}
		case "engine":
			return events.EngineRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow, Host: "h", Name: label}
		default:
			return events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow, Env: "prod", Scene: label, Name: "thumbs"}
		}
	}
	field := map[string]string{"tokens": "model", "gpu": "host", "engine": "name", "feedback": "scene"}
	for _, kind := range []string{"tokens", "gpu", "engine", "feedback"} {
		for _, label := range []string{long, limit} {
			data, err := json.Marshal(rollup(kind, label))
			if err != nil {
				t.Fatal(err)
			}
			m := &msg{subject: "rollup." + kind + ".x.y", data: data}
			before := len(dl.msgs)
			in.Add(m, now)
			switch {
			case label == limit && m.termd:
				t.Errorf("%s rollup with a %s of %d bytes terminated: %v", kind, field[kind], len(label), dl.msgs[len(dl.msgs)-1].Header)
			case label == long && (!m.termd || len(dl.msgs) != before+1):
				t.Errorf("%s rollup with a %s of %d bytes taken", kind, field[kind], len(label))
			case label == long:
				h := dl.msgs[before].Header
				if h.Get("Tokenscope-Reason") != "invalid" || !strings.Contains(h.Get("Tokenscope-Error"), field[kind]+" of 257 bytes") {
					t.Errorf("%s dead letter headers %v", kind, h)
				}
			}
		}
	}
}

// TestWindowKeptOpenByATrickle: rollups that keep coming for one window (put on the stream
// by hand, one every second, each a new message) never let it settle; before, it and every
// later window waited for good, their rollups unacknowledged until the consumer stopped
// delivering. A window is evaluated 2 minutes past its settle and watermark wait after its
// first rollup whatever still arrives, counted and logged once.
func TestWindowKeptOpenByATrickle(t *testing.T) {
	rec := &recorder{}
	var log syncBuffer
	in := New(nil, rec, &sink{}, &memCheckpoint{}, &dead{}, Options{Settle: 2 * time.Second, WatermarkTimeout: time.Minute},
		prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil)))
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w1 := w0.Add(15 * time.Second)
	t0 := w1.Add(20 * time.Second)
	in.Add(tokenMsg(t, w1, events.KindWindow), t0)
	evaluatedAt := time.Duration(-1)
	for s := time.Duration(0); s <= 10*time.Minute; s += time.Second {
		in.Add(tokenMsg(t, w0, events.KindWindow), t0.Add(s))
		if in.Flush(context.Background(), t0.Add(s)) > 0 {
			evaluatedAt = s
			break
		}
	}
	if evaluatedAt < 0 {
		t.Fatal("a window receiving a rollup every second was never evaluated, nor any after it")
	}
	if want := 2*time.Second + time.Minute + 2*time.Minute; evaluatedAt < want || evaluatedAt > want+time.Second {
		t.Errorf("evaluated %s after its first rollup, want %s", evaluatedAt, want)
	}
	if len(rec.windows) != 2 || !rec.windows[0].Start.Equal(w0) || !rec.windows[1].Start.Equal(w1) {
		t.Fatalf("evaluated %d windows, want w0 then w1", len(rec.windows))
	}
	if got := testutil.ToFloat64(in.cut); got != 1 {
		t.Errorf("windows_gathering_cut_total = %v, want 1", got)
	}
	if n := strings.Count(log.String(), "kept receiving rollups"); n != 1 {
		t.Errorf("logged %d times: %s", n, log.String())
	}
}

// syncBuffer is a bytes.Buffer safe for a logger writing from another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRollupCountsThatWrapAround: counts whose sum wraps around a uint64 (errors 2⁶⁴−1 and
// timeouts 1 sum to 0) are invalid, as counts that exceed their total are: taken, the
// window's error rate was 1.8·10¹⁸ and an engine's 2⁶⁴−1 down scrapes out of 0 samples
// made it down.
func TestRollupCountsThatWrapAround(t *testing.T) {
	dl := &dead{}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	start := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := start.Add(20 * time.Second)
	const max64 = ^uint64(0)
	for _, tc := range []struct {
		name, subject string
		v             any
	}{
		{"errors and timeouts", "rollup.tokens.prod.chat", events.TokenRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow,
			Env: "prod", Scene: "chat", Model: "m", Bucket: "0-499", Requests: 10, Errors: max64, Timeouts: 1}},
		{"up and down samples", "rollup.engine.h", events.EngineRollup{V: 1, WindowStart: start, WindowSeconds: 15, Kind: events.KindWindow,
			Host: "h", Name: "vllm", Samples: 0, UpSamples: 1, DownSamples: max64}},
	} {
		data, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		m := &msg{subject: tc.subject, data: data}
		before := len(dl.msgs)
		in.Add(m, now)
		if !m.termd || len(dl.msgs) != before+1 || dl.msgs[before].Header.Get("Tokenscope-Reason") != "invalid" {
			t.Errorf("%s wrapping around: terminated %v, %d dead letters", tc.name, m.termd, len(dl.msgs)-before)
		}
	}
	if in.Pending() != 0 {
		t.Errorf("%d windows gathering, want none", in.Pending())
	}
}

// TestRollupVersion: a rollup of another contract version than 1 (its schema's const), or
// of none, is invalid, dead-lettered naming v, in every kind; it was evaluated as if it were
// version 1.
func TestRollupVersion(t *testing.T) {
	dl := &dead{}
	in := New(nil, &recorder{}, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	start := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := start.Add(20 * time.Second)
	for _, v := range []int{0, 2} {
		for _, kind := range []string{"tokens", "gpu", "engine", "feedback"} {
			m := &msg{subject: "rollup." + kind + ".x.y", data: rollupOf(t, kind, v, start, 15)}
			before := len(dl.msgs)
			in.Add(m, now)
			if !m.termd || len(dl.msgs) != before+1 || !strings.Contains(dl.msgs[before].Header.Get("Tokenscope-Error"), "v=") {
				t.Errorf("%s rollup of v %d: terminated %v, %d dead letters", kind, v, m.termd, len(dl.msgs)-before)
			}
		}
	}
	if in.Pending() != 0 {
		t.Errorf("%d windows gathering, want none", in.Pending())
	}
}

// TestRollupWindowNotAligned: a rollup whose window does not start at a multiple of its
// window_seconds (as every aggregator's tumbling windows do) is invalid, in every kind.
// Taken, it made a window of its own between two real ones, in which every other series was
// absent: each pending alert started again and each firing one counted a normal window, so
// a client publishing such rollups held off every alert.
func TestRollupWindowNotAligned(t *testing.T) {
	rec, dl := &recorder{}, &dead{}
	in := New(nil, rec, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := w0.Add(time.Minute)
	for _, start := range []time.Time{w0.Add(7 * time.Second), w0.Add(500 * time.Millisecond)} {
		for _, kind := range []string{"tokens", "gpu", "engine", "feedback"} {
			m := &msg{subject: "rollup." + kind + ".x.y", data: rollupOf(t, kind, 1, start, 15)}
			before := len(dl.msgs)
			in.Add(m, now)
			if !m.termd || len(dl.msgs) != before+1 || !strings.Contains(dl.msgs[before].Header.Get("Tokenscope-Error"), "window_seconds") {
				t.Errorf("%s rollup of a window at %s: terminated %v, %d dead letters", kind, start.Format("15:04:05.000"), m.termd, len(dl.msgs)-before)
			}
		}
	}
	for _, start := range []time.Time{w0, w0.Add(15 * time.Second)} {
		in.Add(tokenMsg(t, start, events.KindWindow), now)
	}
	in.Flush(context.Background(), now.Add(time.Minute))
	if len(rec.windows) != 2 {
		t.Errorf("%d windows evaluated, want the 2 aligned ones", len(rec.windows))
	}
}
