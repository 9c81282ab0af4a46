package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
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

// TestBusinessAcrossDays follows a product team's data through the business queries on
// 18.16 and on the current engine: conversations whose turns lie a day apart, ids that
// differ only in case, a unicode id of the longest length, a verdict that comes before its
// request and one that comes two days after it, a verdict sent twice, one on a request
// nobody sent, and evaluators' quality scores over many windows. Cost per conversation,
// the verdicts joined to their requests, the outcomes per input bucket and the quality
// median merged from the windows' t-digests are the figures computed from the same events.
func TestBusinessAcrossDays(t *testing.T) {
	b := newBed(t)
	prices := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(prices, []byte(`[{"model":"qwen","input":0.4,"output":1.2}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	startAggregator(t, b.env(envVars{"AGG_PRICES": prices}))
	now := time.Now().UTC().Truncate(time.Second)
	d2 := now.Add(-48 * time.Hour).Truncate(time.Hour)
	req := func(id, conv string, turn int, at time.Time, in int64, outcome events.Outcome) events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: id, TS: at, Model: "qwen", Scene: "chat", Env: "prod",
			InputTokens: in, OutputTokens: 10, TTFTMs: 100, TotalMs: 500, Status: events.StatusOK,
			ConversationID: conv, Turn: turn, Outcome: outcome}
	}
	long := strings.Repeat("会", events.MaxIDLen/3) // 126 bytes
	evs := []events.RequestEvent{
		req("r1", "c-days", 1, d2, 100, ""),
		req("r2", "c-days", 2, d2.Add(time.Minute), 3000, ""),
		req("r3", "c-days", 3, d2.Add(24*time.Hour), 40000, events.OutcomeCompleted),
		req("r4", "Conv-X", 1, d2, 100, ""),
		req("r5", "conv-x", 1, d2, 100, events.OutcomeAbandoned),
		req("r6", long, 1, d2.Add(30*time.Hour), 600, events.OutcomeCompleted),
	}
	cost := func(e events.RequestEvent) float64 {
		return (float64(e.InputTokens)*0.4 + float64(e.OutputTokens)*1.2) / 1e6
	}
	fb := func(id, reqID, conv, name string, v float64, at time.Time, source events.FeedbackSource) events.FeedbackEvent {
		return events.FeedbackEvent{V: 1, EventID: id, TS: at, RequestID: reqID, ConversationID: conv, Name: name, Value: v, Source: source}
	}
	b.publishFeedback(t, fb("f-early", "r1", "", "thumbs", 1, d2.Add(time.Minute), events.SourceUser), "f-early") // before its request
	b.publish(t, evs)
	sent := 1
	for _, f := range []events.FeedbackEvent{
		fb("f-late", "r2", "", "thumbs", 0, now, events.SourceUser), // two days after its request
		fb("f-dup", "r4", "", "thumbs", 1, d2.Add(time.Minute), events.SourceUser),
		fb("f-down", "r5", "", "thumbs", 0, d2.Add(time.Minute), events.SourceUser),
		fb("f-unknown", "nope", "", "thumbs", 1, d2.Add(time.Minute), events.SourceUser),
		fb("f-rate", "", "c-days", "rating", 4, d2.Add(25*time.Hour), events.SourceUser),
	} {
		b.publishFeedback(t, f, f.EventID)
		sent++
	}
	b.publishFeedback(t, fb("f-dup", "r4", "", "thumbs", 1, d2.Add(time.Minute), events.SourceUser), "f-dup-again")
	// Quality scores on r6, in 40 windows of a minute: their median is merged from the
	// windows' digests.
	var quality []float64
	for i := range 200 {
		v := math.Round(1000*math.Exp(-0.5+0.4*math.Sin(float64(i)*1.7))) / 1000
		quality = append(quality, v)
		b.publishFeedback(t, fb(fmt.Sprint("q-", i), "r6", "", "quality", v, d2.Add(30*time.Hour+time.Duration(i%40)*time.Minute), events.SourceEvaluator), fmt.Sprint("q-", i))
		sent++
	}
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, uint64(sent), "SELECT sum(count) FROM feedback_rollups")
	b.waitRows(t, time.Minute, uint64(sent), "SELECT count() FROM feedback")

	params := map[string]string{"from": dt(d2.Add(-time.Hour)), "to": dt(now.Add(time.Hour)), "limit": "100", "layer": "gateway", "name": "thumbs", "satisfied_at": "1"}
	wantConv := map[string][2]float64{} // requests, cost
	for _, e := range evs {
		w := wantConv[e.ConversationID]
		wantConv[e.ConversationID] = [2]float64{w[0] + 1, w[1] + cost(e)}
	}
	sorted := slices.Clone(quality)
	slices.Sort(sorted)
	buckets := events.DefaultBucketBounds()
	wantOutcomes := map[string][2]float64{}
	for _, e := range evs {
		k := buckets.Label(buckets.Index(e.InputTokens))
		w := wantOutcomes[k]
		w[0] += b2f(e.Outcome == events.OutcomeCompleted)
		w[1] += b2f(e.Outcome == events.OutcomeAbandoned)
		wantOutcomes[k] = w
	}
	checks := []struct {
		name, sql string
		check     func(t *testing.T, res *testbed.Result)
	}{
		{"cost_per_conversation.sql", cookbook(t, "cost_per_conversation.sql"), func(t *testing.T, res *testbed.Result) {
			if len(res.Rows) != len(wantConv) {
				t.Fatalf("%d conversations, want %d: %v", len(res.Rows), len(wantConv), res.Rows)
			}
			for _, r := range res.Rows {
				w, ok := wantConv[str(t, r[1])] // after its env
				if !ok || num(t, r[2]) != w[0] || !near(num(t, r[4]), w[1], 1e-9) {
					t.Fatalf("row %v, want %v", r, w)
				}
			}
		}},
		{"satisfaction_by_ttft_band.sql", cookbook(t, "satisfaction_by_ttft_band.sql"), func(t *testing.T, res *testbed.Result) {
			// r1 up (sent before it), r2 down (two days later), r4 up (sent twice), r5 down.
			if len(res.Rows) != 1 || num(t, res.Rows[0][1]) != 4 || num(t, res.Rows[0][2]) != 0.5 {
				t.Fatalf("got %v, want 4 verdicts, half satisfied", res.Rows)
			}
		}},
		{"feedback_coverage.sql", cookbook(t, "feedback_coverage.sql"), func(t *testing.T, res *testbed.Result) {
			r := res.Rows[0]
			// The evaluator's 200 quality scores on r6 are one verdict, its latest, and 199 superseded.
			if num(t, r[0]) != float64(sent-199) || num(t, r[1]) != 0 || num(t, r[2]) != 1 || num(t, r[3]) != 1 || num(t, r[5]) != 199 {
				t.Fatalf("got %v, want %d verdicts, no duplicate row, 1 unknown request, 1 on a conversation, 199 superseded", r, sent-199)
			}
		}},
		{"outcomes per bucket", `SELECT bucket, sum(completed), sum(abandoned) FROM token_rollups WHERE layer = 'gateway' GROUP BY bucket ORDER BY bucket`, func(t *testing.T, res *testbed.Result) {
			if len(res.Rows) != len(wantOutcomes) {
				t.Fatalf("%d buckets, want %d: %v", len(res.Rows), len(wantOutcomes), res.Rows)
			}
			for _, r := range res.Rows {
				if w := wantOutcomes[str(t, r[0])]; num(t, r[1]) != w[0] || num(t, r[2]) != w[1] {
					t.Fatalf("bucket %v: %v completed, %v abandoned; want %v", r[0], r[1], r[2], w)
				}
			}
		}},
		{"quality median merged", `SELECT sum(count), quantileTDigestWeighted(0.5)(m, toUInt32(w)) FROM feedback_rollups ARRAY JOIN value_means AS m, value_weights AS w WHERE name = 'quality'`, func(t *testing.T, res *testbed.Result) {
			// sum(count) reads every centroid's row: the weights add to the count of verdicts.
			if n := b.scalar(t, "SELECT sum(count) FROM feedback_rollups WHERE name = 'quality'"); n != uint64(len(quality)) {
				t.Fatalf("%d quality verdicts rolled up, want %d", n, len(quality))
			}
			if p50 := num(t, res.Rows[0][1]); !withinRank(sorted, 0.5, 0.03, p50) {
				t.Fatalf("merged median %v, exact %v", p50, nearestRank(sorted, 0.5))
			}
		}},
	}
	answers := map[string]*testbed.Result{}
	old := server18(b.db)
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			res, err := old.run(c.sql, params)
			if err != nil {
				t.Fatal(err)
			}
			answers[c.name] = res
			c.check(t, res)
		})
	}
	t.Run("current", func(t *testing.T) {
		cur := serverCurrent(current(t, b, "requests", "feedback", "token_rollups", "feedback_rollups"))
		for _, c := range checks {
			t.Run(c.name, func(t *testing.T) {
				res, err := cur.run(c.sql, params)
				if err != nil {
					t.Fatalf("ClickHouse %s: %v", cur.name, err)
				}
				c.check(t, res)
				if err := testbed.Compare(answers[c.name], res, 1e-9, quantileColumns(res)...); err != nil && c.name != "quality median merged" {
					t.Errorf("ClickHouse %s answers otherwise than 18.16: %v", cur.name, err)
				}
			})
		}
	})
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// TestBusinessQueriesCountWhole checks, on 18.16 and on the current engine, what the
// business queries count: a conversation whose requests carry no turn number (each request
// a turn), a turn asked twice (one turn), the last outcome reported, a conversation that
// started before the range (left out) and one that goes on after it (counted whole), a
// verdict changed under an event_id of its own (the latest counts), a rating given to a
// conversation (counted for its scene and model), an inline score beside an evaluator's on
// the same request (both count), a range with no conversation (0 turns, not NaN), and the
// 7 days read before and after the range.
func TestBusinessQueriesCountWhole(t *testing.T) {
	b := newBed(t)
	prices := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(prices, []byte(`[{"model":"qwen","input":0.4,"output":1.2}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	startAggregator(t, b.env(envVars{"AGG_PRICES": prices}))
	base := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	req := func(id, conv string, turn int, at time.Duration, in int64, outcome events.Outcome) events.RequestEvent {
		return events.RequestEvent{V: 1, EventID: id, TS: base.Add(at), Model: "qwen", Scene: "chat", Env: "prod",
			InputTokens: in, OutputTokens: 10, TTFTMs: 100, TotalMs: 500, Status: events.StatusOK,
			ConversationID: conv, Turn: turn, Outcome: outcome}
	}
	evs := []events.RequestEvent{
		req("b1", "c-before", 1, -30*time.Minute, 100, ""), // started before the range
		req("b2", "c-before", 2, 5*time.Minute, 100, ""),
		req("a", "c-noturn", 0, time.Minute, 100, events.OutcomeAbandoned), // no turn numbers
		req("bb", "c-noturn", 0, 2*time.Minute, 100, ""),
		req("c3", "c-noturn", 0, 3*time.Minute, 100, events.OutcomeCompleted), // the last outcome
		req("x1", "c-after", 1, 50*time.Minute, 5000, ""),
		req("x2", "c-after", 1, 50*time.Minute+2*time.Second, 5000, ""), // turn 1 asked again
		req("x3", "c-after", 2, 70*time.Minute, 5000, ""),               // after the range
	}
	evs[3].Scores = []events.Score{{Name: "quality", Value: 0.6}}
	cost := func(in int64) float64 { return (float64(in)*0.4 + 10*1.2) / 1e6 }
	b.publish(t, evs)
	fb := func(id, reqID, conv, name string, v float64, at time.Duration, source events.FeedbackSource) events.FeedbackEvent {
		return events.FeedbackEvent{V: 1, EventID: id, TS: base.Add(at), RequestID: reqID, ConversationID: conv, Name: name, Value: v, Source: source}
	}
	fbs := []events.FeedbackEvent{
		fb("f1", "a", "", "thumbs", 0, 10*time.Minute, events.SourceUser),
		fb("f2", "a", "", "thumbs", 1, 20*time.Minute, events.SourceUser), // changed: up
		fb("f3", "bb", "", "thumbs", 1, 10*time.Minute, events.SourceUser),
		fb("f4", "", "c-noturn", "rating", 2, 10*time.Minute, events.SourceUser),
		fb("f5", "", "c-noturn", "rating", 5, 20*time.Minute, events.SourceUser), // changed: 5
		fb("f6", "a", "", "quality", 0.1, 10*time.Minute, events.SourceEvaluator),
		fb("f7", "a", "", "quality", 0.8, 20*time.Minute, events.SourceEvaluator), // changed: 0.8
		fb("f8", "bb", "", "quality", 0.9, 10*time.Minute, events.SourceEvaluator),
		fb("f9", "x1", "", "quality", 0.5, 55*time.Minute, events.SourceEvaluator),
	}
	for _, f := range fbs {
		b.publishFeedback(t, f, f.EventID)
	}
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT count() FROM requests")
	b.waitRows(t, time.Minute, uint64(len(fbs)), "SELECT count() FROM feedback")

	// The bounds, at the app layer, written as rows (days off the range): c-prior started 6
	// days before the range (left out), c-silent 8 days before it (past the 7 days read: it
	// counts as starting in the range, its old request unread), and c-long goes on 6 and 8
	// days after it (the first counts, the second is past the 7 days read).
	rb, err := b.db.Conn().PrepareBatch(context.Background(), "INSERT INTO requests (ts, event_id, env, scene, model, conversation_id, turn, layer, cost_usd)")
	if err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	for _, r := range []struct {
		id, conv string
		turn     uint32
		at       time.Duration
		cost     float64
	}{
		{"p1", "c-prior", 1, -6 * day, 0.1}, {"p2", "c-prior", 2, 30 * time.Minute, 0.1},
		{"s1", "c-silent", 1, -8 * day, 0.1}, {"s2", "c-silent", 2, 10 * time.Minute, 0.1},
		{"l1", "c-long", 1, 20 * time.Minute, 0.2}, {"l2", "c-long", 2, time.Hour + 6*day, 0.2}, {"l3", "c-long", 3, time.Hour + 8*day, 0.2},
	} {
		if err := rb.Append(base.Add(r.at), r.id, "prod", "chat", "qwen", r.conv, r.turn, "app", r.cost); err != nil {
			t.Fatal(err)
		}
	}
	if err := rb.Send(); err != nil {
		t.Fatal(err)
	}

	params := map[string]string{"from": dt(base), "to": dt(base.Add(time.Hour)), "limit": "100", "layer": "gateway", "name": "thumbs", "satisfied_at": "1"}
	with := func(kv ...string) map[string]string {
		p := maps.Clone(params)
		for i := 0; i < len(kv); i += 2 {
			p[kv[i]] = kv[i+1]
		}
		return p
	}
	buckets := events.DefaultBucketBounds()
	small, large := buckets.Label(buckets.Index(100)), buckets.Label(buckets.Index(5000))
	rows := func(want ...[]any) func(t *testing.T, res *testbed.Result) {
		return func(t *testing.T, res *testbed.Result) {
			t.Helper()
			if len(res.Rows) != len(want) {
				t.Fatalf("%d rows, want %d: %v", len(res.Rows), len(want), res.Rows)
			}
			for i, w := range want {
				if len(res.Rows[i]) != len(w) {
					t.Fatalf("row %d: %v, want %v", i, res.Rows[i], w)
				}
				for j, x := range w {
					switch x := x.(type) {
					case string:
						if str(t, res.Rows[i][j]) != x {
							t.Fatalf("row %d, %s: %v, want %v", i, res.Columns[j].Name, res.Rows[i], w)
						}
					case float64:
						if got := num(t, res.Rows[i][j]); math.IsNaN(got) || !near(got, x, 1e-9) {
							t.Fatalf("row %d, %s: %v, want %v", i, res.Columns[j].Name, res.Rows[i], w)
						}
					case nil:
						if res.Rows[i][j] != nil {
							t.Fatalf("row %d, %s: %v, want NULL", i, res.Columns[j].Name, res.Rows[i])
						}
					}
				}
			}
		}
	}
	checks := []struct {
		name, file string
		params     map[string]string
		check      func(t *testing.T, res *testbed.Result)
	}{
		// c-noturn: 3 turns, completed; c-after: 2 turns, every request; c-before: not here.
		{"conversations", "conversations.sql", params, rows([]any{2.0, 2.5, 1.0, 0.0, 1.0})},
		{"7 days either side", "conversations.sql", with("layer", "app"), rows([]any{2.0, 1.5, 0.0, 0.0, nil})},
		{"cost 7 days either side", "cost_per_conversation.sql", with("layer", "app"), rows(
			[]any{"prod", "c-long", 2.0, 2.0, 0.4, 0.0, 0.0},
			[]any{"prod", "c-silent", 1.0, 1.0, 0.1, 0.0, 0.0})},
		{"no conversation", "conversations.sql", with("from", dt(base.Add(2*time.Hour)), "to", dt(base.Add(3*time.Hour))), rows([]any{0.0, 0.0, 0.0, 0.0, nil})},
		{"cost per conversation", "cost_per_conversation.sql", params, rows(
			[]any{"prod", "c-after", 3.0, 2.0, 3 * cost(5000), 15000.0, 30.0},
			[]any{"prod", "c-noturn", 3.0, 3.0, 3 * cost(100), 300.0, 30.0})},
		// The latest thumbs on a (up) and bb's (up).
		{"ttft band", "satisfaction_by_ttft_band.sql", params, rows([]any{"1: <= 500 ms", 2.0, 1.0, 1.0})},
		{"stall", "satisfaction_by_stall.sql", params, rows([]any{"0: not streamed", 2.0, 1.0, 1.0})},
		// Quality: a's latest 0.8, bb's 0.9 and its inline 0.6, x1's 0.5; the rating of c-noturn.
		{"quality per scene and model", "quality_by_scene_model.sql", params, rows([]any{"chat", "qwen", 2.0, 1.0, 1.0, 5.0, 4.0, 0.7})},
		{"quality per bucket", "quality_by_bucket.sql", with("name", "quality"), rows(
			[]any{"qwen", "chat", small, 3.0, 0.6, 0.8, 0.9},
			[]any{"qwen", "chat", large, 1.0, 0.5, 0.5, 0.5})},
		// c-noturn rated by its latest thumbs (both up): satisfied at 0.75.
		{"cost per satisfied conversation", "cost_per_satisfied_conversation.sql", with("satisfied_at", "0.75"), rows(
			[]any{"chat", 2.0, (3*cost(100) + 3*cost(5000)) / 2, 1.0, 1.0, 3 * cost(100)})},
		// 7 latest verdicts (one inline, one on a conversation, whose env is found), 3 superseded.
		{"coverage", "feedback_coverage.sql", with("from", dt(base.Add(-time.Hour)), "to", dt(time.Now().Add(time.Hour))), rows([]any{7.0, 0.0, 0.0, 1.0, 1.0, 3.0, 0.0, 0.0})},
	}
	if i := slices.IndexFunc(checks, func(c struct {
		name, file string
		params     map[string]string
		check      func(t *testing.T, res *testbed.Result)
	}) bool {
		return c.file == "quality_by_bucket.sql"
	}); small > large {
		checks[i].check = rows([]any{"qwen", "chat", large, 1.0, 0.5, 0.5, 0.5}, []any{"qwen", "chat", small, 3.0, 0.6, 0.8, 0.9})
	}
	for _, srv := range []struct {
		name string
		srv  func(t *testing.T) server
	}{
		{"18.16", func(*testing.T) server { return server18(b.db) }},
		{"current", func(t *testing.T) server { return serverCurrent(current(t, b, "requests", "feedback")) }},
	} {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.srv(t)
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) {
					res, err := s.run(cookbook(t, c.file), c.params)
					if err != nil {
						t.Fatalf("ClickHouse %s: %v", s.name, err)
					}
					c.check(t, res)
				})
			}
		})
	}
}
