package intake

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestFeedbackRollups checks that feedback rollups join their window beside its token
// rollups, that corrections are skipped, and that bad ones (and token rollups with more
// outcomes than requests) are dead-lettered with their reason, the good ones beside them kept.
func TestFeedbackRollups(t *testing.T) {
	dl := &dead{}
	rec := &recorder{}
	in := New(nil, rec, &sink{}, &memCheckpoint{}, dl, Options{Settle: time.Second}, prometheus.NewRegistry(), discard)
	w0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	fb := func(f func(*events.FeedbackRollup)) *msg {
		r := events.FeedbackRollup{V: 1, WindowStart: w0, WindowSeconds: 15, Kind: events.KindWindow, Env: "prod", Scene: "chat",
			Name: "thumbs", Source: "user", Count: 10, Positive: 7}
		f(&r)
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return &msg{subject: events.FeedbackRollupSubject(r.Env, r.Scene), data: data}
	}
	good := fb(func(*events.FeedbackRollup) {})
	correction := fb(func(r *events.FeedbackRollup) { r.Kind = events.KindCorrection })
	bad := []*msg{
		fb(func(r *events.FeedbackRollup) { r.Positive = 11 }),
		fb(func(r *events.FeedbackRollup) { r.Name = "" }),
		fb(func(r *events.FeedbackRollup) { r.WindowSeconds = 0 }),
		{subject: "rollup.feedback.prod.chat", data: []byte(`{"v":1,"count":-1}`)},
	}
	tooMany := tokenMsg(t, w0, events.KindWindow)
	tooMany.data = []byte(`{"v":1,"window_start":"2026-03-03T12:00:00Z","window_seconds":15,"kind":"window","env":"prod","scene":"chat","model":"m","bucket":"0-499","requests":10,"completed":8,"abandoned":3}`)
	overflow := tokenMsg(t, w0, events.KindWindow)
	overflow.data = []byte(`{"v":1,"window_start":"2026-03-03T12:00:00Z","window_seconds":15,"kind":"window","env":"prod","scene":"chat","model":"m","bucket":"0-499","requests":10,"completed":18446744073709551615,"abandoned":1}`)
	bad = append(bad, tooMany, overflow)
	tok := tokenMsg(t, w0, events.KindWindow)
	for _, m := range append([]*msg{good, correction, tok}, bad...) {
		in.Add(m, w0.Add(20*time.Second))
	}
	for i, m := range bad {
		if !m.termd {
			t.Errorf("bad rollup %d (%s) was not terminated", i, m.data)
		}
	}
	if len(dl.msgs) != len(bad) {
		t.Fatalf("%d dead letters, want %d", len(dl.msgs), len(bad))
	}
	if !correction.acked {
		t.Error("a correction must be acknowledged and skipped")
	}
	in.Flush(context.Background(), w0.Add(30*time.Second))
	if len(rec.windows) != 1 {
		t.Fatalf("%d windows evaluated, want 1", len(rec.windows))
	}
	w := rec.windows[0]
	if len(w.Feedback) != 1 || w.Feedback[0].Positive != 7 || len(w.Tokens) != 1 {
		t.Fatalf("window %+v, want the feedback rollup beside the token rollup", w)
	}
	if !good.acked || !tok.acked {
		t.Error("the window's rollups were not acknowledged once delivered")
	}
}
