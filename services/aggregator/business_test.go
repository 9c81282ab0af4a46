package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// publishFeedback publishes one feedback event under msgID (its event_id for a first send;
// another id stands for a resend past JetStream's duplicate window).
func (b *bed) publishFeedback(t testing.TB, f events.FeedbackEvent, msgID string) {
	t.Helper()
	msg := nats.NewMsg(events.FeedbackSubject(f.Env, f.Scene))
	msg.Data = events.AppendFeedback(nil, &f)
	msg.Header.Set(jetstream.MsgIDHeader, msgID)
	if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// TestFeedbackReusedEventID sends a verdict, the same verdict again past JetStream's
// duplicate window, and a changed verdict (thumbs down made up) under the same event_id,
// before and after a restart. The resend counts once, silently; the changed one is not a
// copy: it is dead-lettered as reused_event_id, saying to give it an id of its own, and the
// first verdict stands, stored and rolled up once.
func TestFeedbackReusedEventID(t *testing.T) {
	b := newBed(t)
	dead, err := b.nc.SubscribeSync(events.SubjectInvalid)
	if err != nil {
		t.Fatal(err)
	}
	vars := b.env(nil)
	stop := startAggregator(t, vars)
	at := time.Now().UTC().Add(-time.Hour).Truncate(time.Millisecond)
	down := events.FeedbackEvent{V: 1, EventID: "fb-1", TS: at, RequestID: "req-1", Name: "thumbs", Value: 0, Source: events.SourceUser}
	up := down
	up.Value, up.TS = 1, at.Add(time.Minute)
	resent := down
	resent.Scene, resent.CommentLength = "chat", 4 // labels and the comment's length are not the verdict
	// A dead letter is sent again when a replay after a restart brings its message again:
	// they are told apart by stream position.
	deadSeqs := map[uint64]bool{}
	wantDead := func(when string, seq uint64) {
		t.Helper()
		for !deadSeqs[seq] {
			m, err := dead.NextMsg(30 * time.Second)
			if err != nil {
				t.Fatalf("%s: no dead letter for the changed verdict at %d: %v", when, seq, err)
			}
			var dl struct {
				Reason, Error, Stream string
				StreamSeq             uint64 `json:"stream_seq"`
			}
			if err := json.Unmarshal(m.Data, &dl); err != nil {
				t.Fatal(err)
			}
			if dl.Reason != "reused_event_id" || dl.Stream != "FEEDBACK" {
				t.Fatalf("%s: dead letter %+v, want reason reused_event_id on FEEDBACK", when, dl)
			}
			deadSeqs[dl.StreamSeq] = true
		}
	}
	b.publishFeedback(t, down, "m1")
	b.publishFeedback(t, resent, "m2")
	b.publishFeedback(t, up, "m3")
	wantDead("before a restart", 3)
	b.waitRows(t, time.Minute, 1, "SELECT count() FROM feedback")
	stop()
	startAggregator(t, vars)
	b.publishFeedback(t, up, "m4")
	wantDead("after a restart", 4)
	b.publishFeedback(t, resent, "m5")
	b.publishFeedback(t, events.FeedbackEvent{V: 1, EventID: "fb-2", TS: at, RequestID: "req-1", Name: "thumbs", Value: 1, Source: events.SourceUser}, "m6")
	b.waitRows(t, time.Minute, 2, "SELECT count() FROM feedback")
	b.waitRows(t, time.Minute, 2, "SELECT sum(count) FROM feedback_rollups")
	for {
		m, err := dead.NextMsg(time.Second)
		if err != nil {
			break
		}
		var dl struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		if err := json.Unmarshal(m.Data, &dl); err != nil || !deadSeqs[dl.StreamSeq] {
			t.Fatalf("a dead letter for another message: %s", m.Data)
		}
	}
	if n := b.scalar(t, "SELECT count() FROM feedback WHERE event_id = 'fb-1' AND value = 0"); n != 1 {
		t.Fatalf("fb-1 stored %d times with its first value, want once", n)
	}
	if n := b.scalar(t, "SELECT sum(positive) FROM feedback_rollups"); n != 1 {
		t.Fatalf("feedback_rollups count %d thumbs up, want 1 (fb-2's)", n)
	}
}
