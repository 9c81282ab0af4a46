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

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
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

type lastMsg struct {
	data []byte
	err  error
}

func (l lastMsg) GetLastMsgForSubject(context.Context, string) (*jetstream.RawStreamMsg, error) {
	if l.err != nil {
		return nil, l.err
	}
	return &jetstream.RawStreamMsg{Data: l.data, Sequence: 7}, nil
}

// TestWatermarkResumes: a process takes the last watermark on ROLLUPS as published, so it
// publishes none at or below it; a pipeline publishing again an earlier process's rollups
// holds the watermark until they are out; what is no watermark of this aggregator, or is
// far ahead of the clock, is ignored.
func TestWatermarkResumes(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	now := t0.Add(time.Minute)
	mark := func(consumer string, through time.Time) []byte {
		return []byte(`{"v":1,"consumer":"` + consumer + `","through":"` + through.Format(time.RFC3339) + `","window_seconds":15,"at":"` + through.Format(time.RFC3339) + `"}`)
	}
	for _, c := range []struct {
		name string
		last lastMsg
		want time.Time
	}{
		{"none", lastMsg{err: jetstream.ErrMsgNotFound}, time.Time{}},
		{"its own", lastMsg{data: mark("agg-a", t0.Add(45*time.Second))}, t0.Add(45 * time.Second)},
		{"another's", lastMsg{data: mark("agg-b", t0.Add(45*time.Second))}, time.Time{}},
		{"not JSON", lastMsg{data: []byte("{")}, time.Time{}},
		{"far ahead", lastMsg{data: mark("agg-a", now.Add(time.Hour))}, time.Time{}},
	} {
		w := NewWatermarks(&jsRecorder{}, &rollupQueue{}, "agg-a", 15*time.Second, prometheus.NewRegistry(), discardLogger())
		got, err := w.Resume(context.Background(), c.last, now)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("%s: resumed from %s (%v), want %s", c.name, got, err, c.want)
		}
	}
	if _, err := NewWatermarks(&jsRecorder{}, &rollupQueue{}, "agg-a", 15*time.Second, prometheus.NewRegistry(), discardLogger()).
		Resume(context.Background(), lastMsg{err: jetstream.ErrNoStreamResponse}, now); err == nil {
		t.Error("an unreadable stream resumed from nothing")
	}

	js := &jsRecorder{}
	w := NewWatermarks(js, &rollupQueue{}, "agg-a", 15*time.Second, prometheus.NewRegistry(), discardLogger())
	if _, err := w.Resume(context.Background(), lastMsg{data: mark("agg-a", t0.Add(45*time.Second))}, now); err != nil {
		t.Fatal(err)
	}
	w.advance("LLM_EVENTS", t0.Add(30*time.Second)) // a replay behind the last published
	if w.publish(context.Background(), now) {
		t.Fatal("published a watermark behind the one resumed from")
	}
	w.hold("GPU_SAMPLES")
	w.advance("LLM_EVENTS", t0.Add(60*time.Second))
	if w.publish(context.Background(), now) {
		t.Fatal("published while a pipeline held the watermark")
	}
	w.release("GPU_SAMPLES")
	if !w.publish(context.Background(), now) || len(js.msgs) != 1 {
		t.Fatalf("%d published after the hold, want 1", len(js.msgs))
	}
}

// TestWatermarkHoldsCount: a pipeline can hold the watermark twice at start (rollups to
// publish again, a backlog to read); ending one hold leaves the other in force.
func TestWatermarkHoldsCount(t *testing.T) {
	js := &jsRecorder{}
	w := NewWatermarks(js, &rollupQueue{}, "agg-a", 15*time.Second, prometheus.NewRegistry(), discardLogger())
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	w.hold("GPU_SAMPLES") // outbox
	w.hold("GPU_SAMPLES") // backlog
	w.advance("LLM_EVENTS", t0.Add(30*time.Second))
	w.release("GPU_SAMPLES")
	if w.publish(context.Background(), t0.Add(time.Minute)) {
		t.Fatal("published while the backlog still held the watermark")
	}
	w.release("GPU_SAMPLES")
	if !w.publish(context.Background(), t0.Add(time.Minute)) || len(js.msgs) != 1 {
		t.Fatalf("%d published once both holds ended, want 1", len(js.msgs))
	}
}

// TestLastPosition: the backlog a pipeline holds the watermark for ends at the last message
// matching its filter, a wildcard one included; an empty stream holds none.
func TestLastPosition(t *testing.T) {
	_, js := testbed.JetStream(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if last, err := lastPosition(ctx, js, events.StreamEvents, events.SubjectRequestsAll); err != nil || last != 0 {
		t.Fatalf("empty stream: %d, %v; want 0", last, err)
	}
	for _, subj := range []string{"llm.req.prod.chat", "llm.req.prod.code", "llm.req.dev.chat"} {
		if _, err := js.Publish(ctx, subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		filter string
		want   uint64
	}{
		{events.SubjectRequestsAll, 3},
		{"llm.req.prod.>", 2},
		{"llm.req.staging.>", 0},
		{"", 3},
	} {
		if last, err := lastPosition(ctx, js, events.StreamEvents, c.filter); err != nil || last != c.want {
			t.Errorf("filter %q: %d, %v; want %d", c.filter, last, err, c.want)
		}
	}
	if _, err := lastPosition(ctx, js, "NO_SUCH_STREAM", ">"); err == nil {
		t.Error("a missing stream gave no error")
	}
}
