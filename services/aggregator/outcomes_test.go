package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestBusinessRollupsPublished sends requests with outcomes and verdicts with scenes: the
// token rollups store and publish the completed and abandoned counts exactly, and every
// stored feedback rollup is published on rollup.feedback.<env>.<scene>, once, with the
// counts the table holds.
func TestBusinessRollupsPublished(t *testing.T) {
	b := newBed(t)
	base := time.Now().UTC().Add(-2 * time.Minute).Truncate(15 * time.Second)
	scenes := []string{"customer-service", "content-gen"}
	var evs []events.RequestEvent
	var completed, abandoned uint64
	for i := range 900 {
		e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * 60 * time.Millisecond),
			Model: "qwen2.5-7b", Scene: scenes[i%2], Env: "prod", InputTokens: 100, OutputTokens: 20, TTFTMs: 200, TotalMs: 900,
			Status: events.StatusOK, ConversationID: "c", Turn: 1}
		switch i % 5 {
		case 0, 1:
			e.Outcome = events.OutcomeCompleted
			completed++
		case 2:
			e.Outcome = events.OutcomeAbandoned
			abandoned++
		}
		evs = append(evs, e)
	}
	var fbs []events.FeedbackEvent
	var ups uint64
	for i := range 400 {
		fb := events.FeedbackEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * 130 * time.Millisecond),
			RequestID: evs[i].EventID, Name: "thumbs", Source: events.SourceUser, Env: "prod", Scene: scenes[i%2]}
		if i%3 != 0 {
			fb.Value = 1
			ups++
		}
		if i%7 == 0 {
			fb.Env, fb.Scene = "", "" // a sender that knows no labels
		}
		fbs = append(fbs, fb)
	}

	type pubTotals struct{ completed, abandoned, verdicts, positive, rollups uint64 }
	var mu sync.Mutex
	var got pubTotals
	ids := map[string]int{}
	sub, err := b.nc.Subscribe("rollup.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.HasPrefix(m.Subject, "rollup.tokens."):
			var r events.TokenRollup
			if err := json.Unmarshal(m.Data, &r); err != nil {
				t.Errorf("token rollup %s: %v", m.Data, err)
				return
			}
			ids[m.Header.Get(jetstream.MsgIDHeader)]++
			got.completed += r.Completed
			got.abandoned += r.Abandoned
		case strings.HasPrefix(m.Subject, "rollup.feedback."):
			var r events.FeedbackRollup
			if err := json.Unmarshal(m.Data, &r); err != nil {
				t.Errorf("feedback rollup %s: %v", m.Data, err)
				return
			}
			if want := events.FeedbackRollupSubject(r.Env, r.Scene); m.Subject != want || r.Name != "thumbs" || r.V != events.Version {
				t.Errorf("feedback rollup on %s, want %s: %+v", m.Subject, want, r)
			}
			ids[m.Header.Get(jetstream.MsgIDHeader)]++
			got.verdicts += r.Count
			got.positive += r.Positive
			got.rollups++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	startAggregator(t, b.env(envVars{"AGG_LOG_LEVEL": "warn"}))
	b.publish(t, evs)
	for i := range fbs {
		msg := nats.NewMsg(events.FeedbackSubject(fbs[i].Env, fbs[i].Scene))
		msg.Data = events.AppendFeedback(nil, &fbs[i])
		msg.Header.Set(jetstream.MsgIDHeader, fbs[i].EventID)
		if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	b.waitRows(t, time.Minute, completed, "SELECT sum(completed) FROM token_rollups")
	b.waitRows(t, time.Minute, uint64(len(fbs)), "SELECT sum(count) FROM feedback_rollups")
	if n := b.scalar(t, "SELECT sum(abandoned) FROM token_rollups"); n != abandoned {
		t.Fatalf("token_rollups: %d abandoned, want %d", n, abandoned)
	}
	if n := b.scalar(t, "SELECT sum(positive) FROM feedback_rollups"); n != ups {
		t.Fatalf("feedback_rollups: %d positive, want %d", n, ups)
	}
	rows := b.scalar(t, "SELECT count() FROM feedback_rollups")
	want := pubTotals{completed: completed, abandoned: abandoned, verdicts: uint64(len(fbs)), positive: ups, rollups: rows}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		g := got
		mu.Unlock()
		if g == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published %+v, want %+v", g, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s published %d times", id, n)
		}
	}
}
