package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// businessQueries are the cookbook queries TestFeedbackThroughAggregator checks (TestCookbook
// leaves them to it): they need feedback beside the requests.
var businessQueries = map[string]bool{
	"satisfaction_by_ttft_band.sql":       true,
	"satisfaction_by_stall.sql":           true,
	"quality_by_scene_model.sql":          true,
	"quality_by_bucket.sql":               true,
	"feedback_coverage.sql":               true,
	"cost_per_satisfied_conversation.sql": true,
	"retries.sql":                         true,
}

func ttftBand(ms float64) string {
	switch {
	case ms <= 500:
		return "1: <= 500 ms"
	case ms <= 2000:
		return "2: <= 2 s"
	case ms <= 5000:
		return "3: <= 5 s"
	}
	return "4: > 5 s"
}

func stallBand(ms float64) string {
	switch {
	case ms == 0:
		return "0: not streamed"
	case ms <= 100:
		return "1: <= 100 ms"
	case ms <= 500:
		return "2: <= 500 ms"
	case ms <= 2000:
		return "3: <= 2 s"
	}
	return "4: > 2 s"
}

// businessTrace builds request events from the conversation trace, four turns to a
// conversation and one scene to it, with a slow-first-token incident in the second third and
// stalled streams in the fourth quarter, and every failed or timed-out turn asked again
// two seconds later.
func businessTrace(rows []traceRow, base time.Time) []events.RequestEvent {
	evs := buildEvents(rows, base, 11)
	scenes := []string{"customer-service", "content-gen"}
	out := make([]events.RequestEvent, 0, len(evs)+len(evs)/50)
	for i := range evs {
		e := &evs[i]
		e.ConversationID, e.Turn, e.Scene = fmt.Sprintf("conv-%04d", i/4), i%4+1, scenes[(i/4)%2]
		if e.Status == events.StatusOK && e.OutputTokens > 0 {
			if i >= len(evs)/3 && i < len(evs)/2 {
				e.TTFTMs += float64(1000 * (i % 7)) // 0 to 6 s more
				e.TotalMs += float64(1000 * (i % 7))
			}
			e.MaxITLMs = math.Min(40+float64(i%60), e.TotalMs-e.TTFTMs)
			if i >= 3*len(evs)/4 && e.TotalMs-e.TTFTMs > 0 {
				e.MaxITLMs = math.Min(float64(300*(i%10)), e.TotalMs-e.TTFTMs)
			}
		}
		out = append(out, *e)
		if e.Status == events.StatusTimeout || e.Status == events.StatusError {
			retry := *e
			retry.EventID, retry.TS, retry.Status, retry.HTTPStatus = events.NewEventID(), e.TS.Add(2*time.Second), events.StatusOK, 0
			if retry.OutputTokens == 0 {
				retry.OutputTokens, retry.TTFTMs, retry.TotalMs = 10, 100, 400
			}
			out = append(out, retry)
		}
	}
	return out
}

// TestFeedbackThroughAggregator sends requests built from the real conversation trace, some
// carrying their own verdicts inline (scores: the app's thumbs and quality), the last third
// after an aggregator restart, and beside them one whose scores are invalid; then minutes
// later their users' thumbs (worse the slower the first token and the longer the
// stalls), evaluators' quality scores and conversation ratings, verdicts on request ids
// nobody sent, verdicts sent twice (by the same message id, which JetStream drops, and by
// another, which the aggregator must drop, also across its restart), and invalid ones. The
// feedback and feedback_rollups tables hold each valid verdict once, the requests table each
// request and its scores once, and every business query of the cookbook gives, on 18.16 and
// on the current engine, the figures computed exactly from the same events, an inline score
// counting as a verdict of source app on its request.
func TestFeedbackThroughAggregator(t *testing.T) {
	rows := readTrace(t, 2400)
	b := newBed(t)
	prices := filepath.Join(t.TempDir(), "prices.json")
	if err := os.WriteFile(prices, []byte(`[{"model":"qwen*","input":0.4,"output":1.2}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	vars := b.env(envVars{"AGG_PRICES": prices})
	stop := startAggregator(t, vars)
	span := rows[len(rows)-1].offset
	base := time.Now().UTC().Add(-span - 2*time.Hour).Truncate(time.Minute)
	evs := businessTrace(rows, base)
	// The app scores the requests its users do not rate (the odd ones): thumbs, worse the
	// slower the first token, and on some a quality score.
	r := rand.New(rand.NewPCG(3, 4))
	inline := 0
	for i := range evs {
		e := &evs[i]
		if e.Status != events.StatusOK || i%2 == 0 {
			continue
		}
		thumbs := 0.0
		if r.Float64() < []float64{0.9, 0.7, 0.45, 0.2}[int(ttftBand(e.TTFTMs)[0]-'1')] {
			thumbs = 1
		}
		e.Scores = []events.Score{{Name: "thumbs", Value: thumbs}}
		if i%10 == 1 {
			e.Scores = append(e.Scores, events.Score{Name: "quality", Value: math.Round(1000*(0.9-0.1*float64(ttftBand(e.TTFTMs)[0]-'1'))) / 1000})
		}
		inline += len(e.Scores)
	}
	restartAt := 2 * len(evs) / 3
	b.publish(t, evs[:restartAt])
	bad := events.AppendRequest(nil, &evs[1])
	b.publishRaw(t, events.RequestSubject("prod", "chat"), append(bad[:len(bad)-1], `,"scores":{"no spaces":1}}`...))
	b.waitRows(t, time.Minute, uint64(restartAt), "SELECT count() FROM requests")
	stop()
	stop = startAggregator(t, vars)
	b.publish(t, evs[restartAt:])
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT count() FROM requests")

	// Verdicts, given minutes after each request.
	var fbs []events.FeedbackEvent
	byReq := map[string]*events.RequestEvent{}
	for i := range evs {
		byReq[evs[i].EventID] = &evs[i]
	}
	after := func(e *events.RequestEvent) time.Time {
		return e.TS.Add(time.Duration(e.TotalMs)*time.Millisecond + time.Duration(1+r.IntN(30))*time.Minute).Truncate(time.Millisecond)
	}
	for i := range evs {
		e := &evs[i]
		if e.Status != events.StatusOK || i%2 == 1 {
			continue
		}
		up := []float64{0.9, 0.7, 0.45, 0.2}[int(ttftBand(e.TTFTMs)[0]-'1')]
		if e.MaxITLMs > 2000 {
			up -= 0.15
		}
		fb := events.FeedbackEvent{V: 1, EventID: events.NewEventID(), TS: after(e), RequestID: e.EventID, Name: "thumbs", Source: events.SourceUser}
		if r.Float64() < up {
			fb.Value = 1
		}
		if i%3 == 0 { // some senders know the labels; the request's own are joined in SQL anyway
			fb.Env, fb.Scene, fb.Model = e.Env, e.Scene, e.Model
		}
		fbs = append(fbs, fb)
		if i%5 == 0 {
			fbs = append(fbs, events.FeedbackEvent{V: 1, EventID: events.NewEventID(), TS: after(e), RequestID: e.EventID,
				Name: "quality", Value: math.Round(1000*(0.95-0.1*float64(ttftBand(e.TTFTMs)[0]-'1')-0.05*r.Float64())) / 1000, Source: events.SourceEvaluator})
		}
	}
	for i := 0; i < len(evs); i += 28 {
		fbs = append(fbs, events.FeedbackEvent{V: 1, EventID: events.NewEventID(), TS: after(&evs[i]), ConversationID: evs[i].ConversationID,
			Name: "rating", Value: float64(1 + r.IntN(5)), Source: events.SourceUser, CommentLength: r.IntN(200)})
	}
	for i := range 50 {
		fbs = append(fbs, events.FeedbackEvent{V: 1, EventID: events.NewEventID(), TS: after(&evs[i]), RequestID: fmt.Sprintf("unknown-%d", i),
			Name: "thumbs", Value: 1, Source: events.SourceUser})
	}
	pub := func(fb *events.FeedbackEvent, msgID string) {
		msg := nats.NewMsg(events.FeedbackSubject(fb.Env, fb.Scene))
		msg.Data = events.AppendFeedback(nil, fb)
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
		if _, err := b.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	half := len(fbs) / 2
	for i := range fbs[:half] {
		pub(&fbs[i], fbs[i].EventID)
	}
	for i := range 20 {
		pub(&fbs[i], fbs[i].EventID)              // JetStream drops it
		pub(&fbs[i+20], "resent-"+fbs[i].EventID) // past the duplicate window: the aggregator drops it
	}
	b.publishRaw(t, "llm.feedback.prod.chat", []byte(`{"v":1,"event_id":"bad-1","ts":"2026-11-30T10:00:00Z","name":"thumbs","value":1,"source":"user"}`))
	b.publishRaw(t, "llm.feedback.prod.chat", []byte(`{"v":1,"event_id":"bad-2"`))
	b.waitRows(t, time.Minute, uint64(half), "SELECT count() FROM feedback")

	// A restart in between: the ids already counted are read back from ClickHouse.
	time.Sleep(time.Second) // the invalid request, had it been taken, would be stored by now
	if n := b.scalar(t, "SELECT count() FROM requests"); n != uint64(len(evs)) {
		t.Fatalf("requests holds %d rows, want %d", n, len(evs))
	}
	if n := b.scalar(t, "SELECT sum(length(score_names)) FROM requests"); n != uint64(inline) {
		t.Fatalf("requests hold %d inline scores, want %d", n, inline)
	}
	if n := b.scalar(t, "SELECT sum(length(score_values)) FROM requests"); n != uint64(inline) {
		t.Fatalf("requests hold %d inline score values, want %d", n, inline)
	}
	stop()
	startAggregator(t, vars)
	for i := range fbs[half:] {
		pub(&fbs[half+i], fbs[half+i].EventID)
	}
	for i := range 10 {
		pub(&fbs[40+i], "again-"+fbs[40+i].EventID)
		pub(&fbs[len(fbs)-1-i], "again-"+fbs[len(fbs)-1-i].EventID)
	}
	b.waitRows(t, time.Minute, uint64(len(fbs)), "SELECT sum(count) FROM feedback_rollups")
	b.waitRows(t, 30*time.Second, uint64(len(fbs)), "SELECT count() FROM feedback")
	time.Sleep(time.Second) // nothing more arrives
	if n := b.scalar(t, "SELECT count() FROM feedback"); n != uint64(len(fbs)) {
		t.Fatalf("feedback holds %d rows, want %d", n, len(fbs))
	}
	if n := b.scalar(t, "SELECT uniqExact(event_id) FROM feedback"); n != uint64(len(fbs)) {
		t.Fatalf("feedback holds %d distinct verdicts, want %d", n, len(fbs))
	}
	if n := b.scalar(t, "SELECT sum(count) FROM feedback_rollups"); n != uint64(len(fbs)) {
		t.Fatalf("feedback_rollups count %d verdicts, want %d", n, len(fbs))
	}
	var ups uint64
	for _, f := range fbs {
		if f.Name == "thumbs" && f.Value > 0 {
			ups++
		}
	}
	if n := b.scalar(t, "SELECT sum(positive) FROM feedback_rollups WHERE name = 'thumbs'"); n != ups {
		t.Fatalf("feedback_rollups count %d thumbs up, want %d", n, ups)
	}

	// The exact figures.
	type band struct{ n, sat, sum float64 }
	ttft, stall := map[string]*band{}, map[string]*band{}
	add := func(m map[string]*band, k string, v, satAt float64) {
		x := m[k]
		if x == nil {
			x = &band{}
			m[k] = x
		}
		x.n++
		x.sum += v
		if v >= satAt {
			x.sat++
		}
	}
	type sm struct{ scene, model string }
	type quality struct{ thumbs, up, ratings, ratingSum, scores, scoreSum float64 }
	qual := map[sm]*quality{}
	buckets := events.DefaultBucketBounds()
	qualBucket := map[[3]string][]float64{} // model, scene, bucket: quality verdicts
	convThumbs := map[string][]float64{}
	unknown, convOnly := 0, 0
	verdicts := slices.Clone(fbs) // what the queries count: feedback, and each inline score
	for _, e := range evs {
		for _, sc := range e.Scores {
			verdicts = append(verdicts, events.FeedbackEvent{V: 1, EventID: e.EventID + "/" + sc.Name, TS: e.TS, RequestID: e.EventID,
				ConversationID: e.ConversationID, Name: sc.Name, Value: sc.Value, Source: "app"})
		}
	}
	// A conversation's rating counts for its scene and the model of its last request, of the
	// greatest event_id among those of the same ts (18.16 stores ts in seconds, and the
	// current engine's copy holds the same).
	last := map[string]*events.RequestEvent{}
	later := func(a, b *events.RequestEvent) bool {
		at, bt := a.TS.Truncate(time.Second), b.TS.Truncate(time.Second)
		return at.After(bt) || at.Equal(bt) && a.EventID > b.EventID
	}
	for i := range evs {
		if l := last[evs[i].ConversationID]; l == nil || later(&evs[i], l) {
			last[evs[i].ConversationID] = &evs[i]
		}
	}
	for _, f := range verdicts {
		if f.RequestID == "" {
			convOnly++
			if e := last[f.ConversationID]; e != nil && f.Name == "rating" {
				k := sm{e.Scene, e.Model}
				if qual[k] == nil {
					qual[k] = &quality{}
				}
				qual[k].ratings++
				qual[k].ratingSum += f.Value
			}
			continue
		}
		e := byReq[f.RequestID]
		if e == nil {
			unknown++
			continue
		}
		k := sm{e.Scene, e.Model}
		if qual[k] == nil {
			qual[k] = &quality{}
		}
		switch f.Name {
		case "thumbs":
			add(ttft, ttftBand(e.TTFTMs), f.Value, 1)
			add(stall, stallBand(e.MaxITLMs), f.Value, 1)
			qual[k].thumbs++
			if f.Value > 0 {
				qual[k].up++
			}
			convThumbs[e.ConversationID] = append(convThumbs[e.ConversationID], f.Value)
		case "quality":
			qual[k].scores++
			qual[k].scoreSum += f.Value
			bk := [3]string{e.Model, e.Scene, buckets.Label(buckets.Index(e.InputTokens))}
			qualBucket[bk] = append(qualBucket[bk], f.Value)
		}
	}
	type conv struct {
		scene string
		cost  float64
	}
	convs := map[string]*conv{}
	type turn struct {
		conv  string
		turn  int
		first events.Status
		at    time.Time
		n     int
	}
	turns := map[[2]any]*turn{}
	for _, e := range evs {
		c := convs[e.ConversationID]
		if c == nil {
			c = &conv{scene: e.Scene}
			convs[e.ConversationID] = c
		}
		if e.Model[:4] == "qwen" {
			c.cost += (float64(e.InputTokens)*0.4 + float64(e.OutputTokens)*1.2) / 1e6
		}
		k := [2]any{e.ConversationID, e.Turn}
		tu := turns[k]
		if tu == nil {
			tu = &turn{conv: e.ConversationID, turn: e.Turn, first: e.Status, at: e.TS}
			turns[k] = tu
		}
		tu.n++
		if e.TS.Before(tu.at) {
			tu.first, tu.at = e.Status, e.TS
		}
	}
	ratings := 0.0
	for _, q := range qual {
		ratings += q.ratings
	}
	if unknown != 50 || convOnly == 0 || ratings != float64(convOnly) {
		t.Fatalf("test data: %d unknown, %d on conversations only", unknown, convOnly)
	}

	params := map[string]string{"from": dt(base), "to": dt(base.Add(span + time.Hour)), "name": "thumbs", "satisfied_at": "1", "layer": "gateway"}
	bands := func(m map[string]*band) func(t *testing.T, res *testbed.Result) {
		return func(t *testing.T, res *testbed.Result) {
			if len(res.Rows) != len(m) {
				t.Fatalf("%d bands, want %d: %v", len(res.Rows), len(m), res.Rows)
			}
			for _, row := range res.Rows {
				x := m[str(t, row[0])]
				if x == nil {
					t.Fatalf("unexpected band %v", row)
				}
				if n, sat, mean := num(t, row[1]), num(t, row[2]), num(t, row[3]); n != x.n || !near(sat, x.sat/x.n, 1e-9) || !near(mean, x.sum/x.n, 1e-9) {
					t.Fatalf("band %v: got %v verdicts, %v satisfied, mean %v; want %v %v %v", row[0], n, sat, mean, x.n, x.sat/x.n, x.sum/x.n)
				}
			}
		}
	}
	checks := []struct {
		file   string
		params map[string]string
		check  func(t *testing.T, res *testbed.Result)
	}{
		{"satisfaction_by_ttft_band.sql", params, bands(ttft)},
		{"satisfaction_by_stall.sql", params, bands(stall)},
		{"quality_by_scene_model.sql", params, func(t *testing.T, res *testbed.Result) {
			if len(res.Rows) != len(qual) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(qual))
			}
			for _, row := range res.Rows {
				q := qual[sm{str(t, row[0]), str(t, row[1])}]
				if q == nil {
					t.Fatalf("unexpected row %v", row)
				}
				if num(t, row[2]) != q.thumbs || !near(num(t, row[3]), ratio(q.up, q.thumbs), 1e-9) ||
					num(t, row[4]) != q.ratings || !near(num(t, row[5]), ratio(q.ratingSum, q.ratings), 1e-9) ||
					num(t, row[6]) != q.scores || !near(num(t, row[7]), ratio(q.scoreSum, q.scores), 1e-9) {
					t.Fatalf("row %v, want %+v", row, q)
				}
			}
		}},
		{"quality_by_bucket.sql", map[string]string{"from": dt(base), "to": dt(base.Add(span + time.Hour)), "name": "quality", "layer": "gateway"}, func(t *testing.T, res *testbed.Result) {
			if len(res.Rows) != len(qualBucket) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(qualBucket))
			}
			for _, row := range res.Rows {
				vs := qualBucket[[3]string{str(t, row[0]), str(t, row[1]), str(t, row[2])}]
				if len(vs) == 0 || num(t, row[3]) != float64(len(vs)) {
					t.Fatalf("row %v, want %d verdicts", row, len(vs))
				}
				slices.Sort(vs)
				for i, q := range []float64{0.1, 0.5, 0.9} {
					if w := vs[int(q*float64(len(vs)))]; num(t, row[4+i]) != w { // quantileExact: the value at rank q·n
						t.Fatalf("row %v: p%g, want %v", row, q*100, w)
					}
				}
			}
		}},
		{"feedback_coverage.sql", map[string]string{"from": dt(base), "to": dt(time.Now().Add(time.Hour))}, func(t *testing.T, res *testbed.Result) {
			row := res.Rows[0]
			if num(t, row[0]) != float64(len(verdicts)) || num(t, row[1]) != 0 || num(t, row[2]) != 50 || num(t, row[3]) != float64(convOnly) || num(t, row[4]) != float64(inline) || num(t, row[5]) != 0 {
				t.Fatalf("got %v, want %d verdicts, 0 duplicate rows, 50 unknown, %d on conversations, %d inline, none superseded", row, len(verdicts), convOnly, inline)
			}
		}},
		{"cost_per_satisfied_conversation.sql", map[string]string{"from": dt(base), "to": dt(base.Add(span + time.Hour)), "name": "thumbs", "satisfied_at": "0.5", "layer": "gateway"},
			func(t *testing.T, res *testbed.Result) {
				type want struct{ n, cost, rated, sat, ratedCost float64 }
				ws := map[string]*want{}
				for id, c := range convs {
					w := ws[c.scene]
					if w == nil {
						w = &want{}
						ws[c.scene] = w
					}
					w.n++
					w.cost += c.cost
					if vs := convThumbs[id]; len(vs) > 0 {
						w.rated++
						w.ratedCost += c.cost
						s := 0.0
						for _, v := range vs {
							s += v
						}
						if s/float64(len(vs)) >= 0.5 {
							w.sat++
						}
					}
				}
				if len(res.Rows) != len(ws) {
					t.Fatalf("%d rows, want %d", len(res.Rows), len(ws))
				}
				for _, row := range res.Rows {
					w := ws[str(t, row[0])]
					if num(t, row[1]) != w.n || !near(num(t, row[2]), w.cost/w.n, 1e-9) || num(t, row[3]) != w.rated || num(t, row[4]) != w.sat ||
						!near(num(t, row[5]), w.ratedCost/w.sat, 1e-9) {
						t.Fatalf("row %v, want %+v", row, w)
					}
				}
			}},
		{"retries.sql", params, func(t *testing.T, res *testbed.Result) {
			type want struct{ convs, retried, withRetry map[string]bool }
			ws := map[string]*want{}
			for _, tu := range turns {
				s := convs[tu.conv].scene
				w := ws[s]
				if w == nil {
					w = &want{map[string]bool{}, map[string]bool{}, map[string]bool{}}
					ws[s] = w
				}
				w.convs[tu.conv] = true
				if tu.n > 1 && (tu.first == events.StatusTimeout || tu.first == events.StatusError) {
					w.retried[fmt.Sprint(tu.conv, tu.turn)] = true
					w.withRetry[tu.conv] = true
				}
			}
			total := 0
			for _, row := range res.Rows {
				w := ws[str(t, row[0])]
				total += len(w.retried)
				if num(t, row[1]) != float64(len(w.convs)) || num(t, row[2]) != float64(len(w.retried)) || num(t, row[3]) != float64(len(w.withRetry)) ||
					!near(num(t, row[4]), float64(len(w.withRetry))/float64(len(w.convs)), 1e-9) {
					t.Fatalf("row %v, want %d conversations, %d retried turns, %d with a retry", row, len(w.convs), len(w.retried), len(w.withRetry))
				}
			}
			if len(res.Rows) != len(ws) || total == 0 {
				t.Fatalf("%d rows, want %d; %d retried turns", len(res.Rows), len(ws), total)
			}
		}},
	}
	names := make([]string, 0, len(businessQueries))
	for f := range businessQueries {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		found := false
		for _, c := range checks {
			found = found || c.file == f
		}
		if !found {
			t.Errorf("%s has no check here", f)
		}
	}
	answers := map[string]*testbed.Result{}
	old := server18(b.db)
	for _, c := range checks {
		t.Run(c.file, func(t *testing.T) {
			res, err := old.run(cookbook(t, c.file), c.params)
			if err != nil {
				t.Fatal(err)
			}
			answers[c.file] = res
			c.check(t, res)
		})
	}
	t.Run("current", func(t *testing.T) {
		cur := serverCurrent(current(t, b, "requests", "feedback"))
		for _, c := range checks {
			t.Run(c.file, func(t *testing.T) {
				res, err := cur.run(cookbook(t, c.file), c.params)
				if err != nil {
					t.Fatalf("ClickHouse %s: %v", cur.name, err)
				}
				c.check(t, res)
				if want := answers[c.file]; want != nil {
					if err := testbed.Compare(want, res, 1e-9); err != nil {
						t.Errorf("ClickHouse %s answers otherwise than 18.16: %v", cur.name, err)
					}
				}
			})
		}
	})
}

// ratio is a / b, 0 when b is: what the queries answer for a share of nothing.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
