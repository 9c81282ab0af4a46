package intake

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
)

// msg is a rollup message; only what the intake calls is implemented.
type msg struct {
	jetstream.Msg
	subject      string
	data         []byte
	acked, termd bool
}

func (m *msg) Subject() string { return m.subject }
func (m *msg) Data() []byte    { return m.data }
func (m *msg) Ack() error      { m.acked = true; return nil }
func (m *msg) Term() error     { m.termd = true; return nil }

type recorder struct{ windows []engine.Window }

func (r *recorder) Evaluate(w engine.Window) []events.Alert {
	r.windows = append(r.windows, w)
	return nil
}

type sink struct{ calls int }

func (s *sink) Send(context.Context, []events.Alert) error { s.calls++; return nil }

type dead struct{ msgs []*nats.Msg }

func (d *dead) PublishMsg(m *nats.Msg) error { d.msgs = append(d.msgs, m); return nil }

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
	rec, sk, dl := &recorder{}, &sink{}, &dead{}
	reg := prometheus.NewRegistry()
	in := New(nil, rec, sk, dl, Options{Settle: 2 * time.Second}, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	if !m1.acked || !m2.acked || !m3.acked || sk.calls != 2 {
		t.Error("messages must be acked once their window is evaluated and sent")
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
