package pipeline

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

func TestWindowsClosedThrough(t *testing.T) {
	f := func(wm string, window, lateness time.Duration, want string) {
		t.Helper()
		var w time.Time
		if wm != "" {
			w, _ = time.Parse(time.RFC3339Nano, wm)
		}
		got := windowsClosedThrough(w, window, lateness)
		if want == "" {
			if !got.IsZero() {
				t.Errorf("wm %q: got %s, want none", wm, got)
			}
			return
		}
		if got.Format(time.RFC3339Nano) != want {
			t.Errorf("wm %q window %s lateness %s: got %s, want %s", wm, window, lateness, got.Format(time.RFC3339Nano), want)
		}
	}
	f("", 15*time.Second, 30*time.Second, "")
	// A window closes once the watermark reaches its end + lateness, not before.
	f("2026-03-03T12:00:45Z", 15*time.Second, 30*time.Second, "2026-03-03T12:00:15Z")
	f("2026-03-03T12:00:44.999Z", 15*time.Second, 30*time.Second, "2026-03-03T12:00:00Z")
	f("2026-03-03T12:00:03Z", 2*time.Second, time.Second, "2026-03-03T12:00:02Z")
}

type rollupQueue struct{ n int }

func (q *rollupQueue) Buffered() int { return q.n }

type jsRecorder struct{ msgs []*nats.Msg }

func (j *jsRecorder) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	j.msgs = append(j.msgs, m)
	return &jetstream.PubAck{}, nil
}

// TestWatermarkWaitsForRollups: the watermark is the lowest over the pipelines, goes out
// only once the rollups queued before it are acknowledged, and never moves back.
func TestWatermarkWaitsForRollups(t *testing.T) {
	q, js := &rollupQueue{}, &jsRecorder{}
	w := NewWatermarks(js, q, "agg-a", 15*time.Second, prometheus.NewRegistry(), discardLogger())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Minute)
	if w.publish(context.Background(), now) {
		t.Fatal("published a watermark before any pipeline reported")
	}
	w.advance("LLM_EVENTS", t0.Add(30*time.Second))
	w.advance("GPU_SAMPLES", t0.Add(15*time.Second))
	q.n = 3
	if w.publish(context.Background(), now) {
		t.Fatal("published while rollups were unacknowledged")
	}
	q.n = 0
	if !w.publish(context.Background(), now) || !w.sent.Equal(t0.Add(15*time.Second)) {
		t.Fatalf("sent %s, want the lower pipeline's %s", w.sent, t0.Add(15*time.Second))
	}
	w.advance("GPU_SAMPLES", t0) // behind: ignored
	if w.publish(context.Background(), now) || len(js.msgs) != 1 || js.msgs[0].Subject != "rollup.watermark.agg-a" {
		t.Fatalf("%d published", len(js.msgs))
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
