package main

import (
	"context"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// query reads a cookbook query and fills its {name:Type} parameters with literals, as
// clickhouse-client --param_name would.
func query(t *testing.T, name string, params map[string]string) string {
	t.Helper()
	raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+name)
	if err != nil {
		t.Fatal(err)
	}
	q := string(raw)
	for k, v := range params {
		for _, typ := range []string{"DateTime", "String", "UInt32"} {
			q = strings.ReplaceAll(q, "{"+k+":"+typ+"}", v)
		}
	}
	if strings.Contains(q, "{") {
		t.Fatalf("%s has unfilled parameters: %s", name, q)
	}
	return q
}

func dt(t time.Time) string { return fmt.Sprintf("toDateTime(%d)", t.Unix()) }

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want)+1e-9 }

// withinRank reports whether an estimated q-quantile of sorted lies between the exact
// quantiles at q−eps and q+eps: the fair test of a quantile sketch on a small sample, where
// neighbouring ranks can be far apart.
func withinRank(sorted []float64, q, eps, got float64) bool {
	lo, hi := nearestRank(sorted, max(q-eps, 0)), nearestRank(sorted, min(q+eps, 1))
	return got >= lo*(1-1e-6) && got <= hi*(1+1e-6)
}

// TestCookbook runs every query of schemas/clickhouse/queries on ClickHouse over data the
// aggregator wrote, and checks each against values computed exactly from the same events.
func TestCookbook(t *testing.T) {
	b := newBed(t)
	dir := t.TempDir()
	pricesFile := filepath.Join(dir, "prices.json")
	os.WriteFile(pricesFile, []byte(`[{"model":"qwen*","input":0.4,"output":1.2,"cached_input":0.1}]`), 0o644)
	startAggregator(t, b.env(envVars{"AGG_PRICES": pricesFile}))

	r := rand.New(rand.NewPCG(5, 6))
	base := time.Now().UTC().Add(-30 * time.Minute).Truncate(time.Minute)
	models := []string{"qwen2.5-72b", "llama-3.1-8b"}
	var evs []events.RequestEvent
	conv := map[string]struct {
		turns   int
		outcome events.Outcome
		cost    float64
	}{}
	for i := range 4000 {
		in := int64(math.Exp(5 + 2*r.Float64()*r.Float64()*2.5))
		out := int64(2 + r.IntN(400))
		ttft := (50 + 0.1*float64(in)) * math.Exp(0.3*r.NormFloat64())
		tpot := 20 * math.Exp(0.2*r.NormFloat64())
		e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * 300 * time.Millisecond),
			Model: models[i%2], Scene: []string{"chat", "search"}[r.IntN(2)], Env: "prod",
			InputTokens: in, OutputTokens: out, CachedInputTokens: in / int64(2+r.IntN(3)),
			TTFTMs: math.Round(ttft*100) / 100, TotalMs: math.Round((ttft+tpot*float64(out-1))*100) / 100, Status: events.StatusOK}
		switch p := r.Float64(); {
		case p < 0.02:
			e.Status, e.ErrorCode, e.HTTPStatus = events.StatusError, "429", 429
		case p < 0.03:
			e.Status, e.ErrorCode = events.StatusError, "overloaded_error"
		case p < 0.05:
			e.Status = events.StatusTimeout
		}
		if i%4 == 0 {
			c := fmt.Sprintf("conv-%03d", i/40)
			st := conv[c]
			st.turns++
			e.ConversationID, e.Turn = c, st.turns
			if st.turns == 10 {
				e.Outcome = []events.Outcome{events.OutcomeCompleted, events.OutcomeAbandoned}[r.IntN(2)]
				st.outcome = e.Outcome
			}
			if e.Model == "qwen2.5-72b" {
				st.cost += (float64(e.InputTokens-e.CachedInputTokens)*0.4 + float64(e.CachedInputTokens)*0.1 + float64(e.OutputTokens)*1.2) / 1e6
			}
			conv[c] = st
		}
		evs = append(evs, e)
	}
	b.publish(t, evs)
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT count() FROM requests")
	params := map[string]string{"from": dt(base), "to": dt(base.Add(time.Hour)), "model": "'qwen2.5-72b'", "limit": "1000"}
	ctx := context.Background()
	buckets := events.DefaultBucketBounds()

	t.Run("percentiles_by_bucket", func(t *testing.T) {
		type key struct{ model, scene, bucket string }
		ttft, tpot := map[key][]float64{}, map[key][]float64{}
		count := map[key]uint64{}
		for _, e := range evs {
			k := key{e.Model, e.Scene, buckets.Label(buckets.Index(e.InputTokens))}
			count[k]++
			if e.Status == events.StatusOK || e.OutputTokens > 0 {
				ttft[k] = append(ttft[k], e.TTFTMs)
			}
			if v, ok := e.TPOT(); ok && e.Status == events.StatusOK {
				tpot[k] = append(tpot[k], v)
			}
		}
		rows, err := b.db.Conn().Query(ctx, query(t, "percentiles_by_bucket.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var k key
			var reqs uint64
			var p [6]float64
			if err := rows.Scan(&k.model, &k.scene, &k.bucket, &reqs, &p[0], &p[1], &p[2], &p[3], &p[4], &p[5]); err != nil {
				t.Fatal(err)
			}
			n++
			if reqs != count[k] {
				t.Fatalf("%v: %d requests, want %d", k, reqs, count[k])
			}
			if len(ttft[k]) < 200 { // percentiles of a handful of samples say little
				continue
			}
			slices.Sort(ttft[k])
			slices.Sort(tpot[k])
			for i, q := range []float64{0.5, 0.95, 0.99} {
				if !withinRank(ttft[k], q, 0.01, p[i]) {
					t.Errorf("%v ttft p%g = %v, exact %v", k, q*100, p[i], nearestRank(ttft[k], q))
				}
				if !withinRank(tpot[k], q, 0.01, p[3+i]) {
					t.Errorf("%v tpot p%g = %v, exact %v", k, q*100, p[3+i], nearestRank(tpot[k], q))
				}
			}
		}
		if n != len(count) {
			t.Fatalf("%d rows, want %d", n, len(count))
		}
	})

	t.Run("merged_p99", func(t *testing.T) {
		var xs []float64
		for _, e := range evs {
			if e.Model == "qwen2.5-72b" && (e.Status == events.StatusOK || e.OutputTokens > 0) {
				xs = append(xs, e.TTFTMs)
			}
		}
		slices.Sort(xs)
		var n uint64
		var p99, p999 float64
		if err := b.db.Conn().QueryRow(ctx, query(t, "merged_p99.sql", params)).Scan(&n, &p99, &p999); err != nil {
			t.Fatal(err)
		}
		// 2,000 samples: rank tolerance; TestMergedAccuracy240Windows checks the relative error.
		if n != uint64(len(xs)) || !withinRank(xs, 0.99, 0.005, p99) || !withinRank(xs, 0.999, 0.002, p999) {
			t.Fatalf("n %d p99 %v p99.9 %v; exact n %d p99 %v p99.9 %v", n, p99, p999, len(xs), nearestRank(xs, 0.99), nearestRank(xs, 0.999))
		}
	})

	t.Run("tokens_per_second", func(t *testing.T) {
		type key struct {
			minute time.Time
			model  string
		}
		want := map[key]uint64{}
		for _, e := range evs {
			want[key{e.TS.Truncate(time.Minute), e.Model}] += uint64(e.OutputTokens)
		}
		rows, err := b.db.Conn().Query(ctx, query(t, "tokens_per_second.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var k key
			var outPS, inPS float64
			var reqs uint64
			if err := rows.Scan(&k.minute, &k.model, &outPS, &inPS, &reqs); err != nil {
				t.Fatal(err)
			}
			n++
			if w := float64(want[key{k.minute.UTC(), k.model}]) / 60; !near(outPS, w, 1e-9) {
				t.Fatalf("%v: %v tokens/s, want %v", k, outPS, w)
			}
		}
		if n != len(want) {
			t.Fatalf("%d rows, want %d", n, len(want))
		}
	})

	type ms struct{ model, scene string }
	t.Run("error_vs_timeout", func(t *testing.T) {
		type agg struct{ reqs, errs, tos, rl float64 }
		want := map[ms]*agg{}
		for _, e := range evs {
			a := want[ms{e.Model, e.Scene}]
			if a == nil {
				a = &agg{}
				want[ms{e.Model, e.Scene}] = a
			}
			a.reqs++
			switch e.Status {
			case events.StatusError:
				a.errs++
			case events.StatusTimeout:
				a.tos++
			}
			if e.RateLimited() {
				a.rl++
			}
		}
		rows, err := b.db.Conn().Query(ctx, query(t, "error_vs_timeout.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var k ms
			var reqs uint64
			var er, tr, cr, rl float64
			if err := rows.Scan(&k.model, &k.scene, &reqs, &er, &tr, &cr, &rl); err != nil {
				t.Fatal(err)
			}
			w := want[k]
			if float64(reqs) != w.reqs || !near(er, w.errs/w.reqs, 1e-9) || !near(tr, w.tos/w.reqs, 1e-9) || !near(rl, w.rl/w.reqs, 1e-9) || cr != 0 {
				t.Fatalf("%v: %d %v %v %v %v; want %+v", k, reqs, er, tr, cr, rl, *w)
			}
		}
	})

	t.Run("error_codes", func(t *testing.T) {
		want := map[string]uint64{}
		for _, e := range evs {
			if e.Status != events.StatusOK {
				want[string(e.Status)+"/"+e.ErrorCode]++
			}
		}
		rows, err := b.db.Conn().Query(ctx, query(t, "error_codes.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]uint64{}
		for rows.Next() {
			var st, code string
			var n uint64
			if err := rows.Scan(&st, &code, &n); err != nil {
				t.Fatal(err)
			}
			got[st+"/"+code] = n
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})

	t.Run("prefix_cache", func(t *testing.T) {
		cached, input := map[string]float64{}, map[string]float64{}
		for _, e := range evs {
			cached[e.Model] += float64(e.CachedInputTokens)
			input[e.Model] += float64(e.InputTokens)
		}
		rows, err := b.db.Conn().Query(ctx, query(t, "prefix_cache.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var model string
			var c, in uint64
			var rate float64
			if err := rows.Scan(&model, &c, &in, &rate); err != nil {
				t.Fatal(err)
			}
			if float64(c) != cached[model] || !near(rate, cached[model]/input[model], 1e-9) {
				t.Fatalf("%s: %d cached, rate %v; want %v, %v", model, c, rate, cached[model], cached[model]/input[model])
			}
		}
	})

	t.Run("cost_per_request", func(t *testing.T) {
		cost, reqs := map[ms]float64{}, map[ms]float64{}
		for _, e := range evs {
			k := ms{e.Model, e.Scene}
			reqs[k]++
			if e.Model == "qwen2.5-72b" {
				cost[k] += (float64(e.InputTokens-e.CachedInputTokens)*0.4 + float64(e.CachedInputTokens)*0.1 + float64(e.OutputTokens)*1.2) / 1e6
			}
		}
		rows, err := b.db.Conn().Query(ctx, query(t, "cost_per_request.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var k ms
			var n, unpriced uint64
			var c, per float64
			if err := rows.Scan(&k.model, &k.scene, &n, &c, &per, &unpriced); err != nil {
				t.Fatal(err)
			}
			wantUnpriced := uint64(0)
			if k.model != "qwen2.5-72b" {
				wantUnpriced = n
			}
			if !near(c, cost[k], 1e-9) || !near(per, cost[k]/reqs[k], 1e-9) || unpriced != wantUnpriced {
				t.Fatalf("%v: cost %v per %v unpriced %d; want %v %v %d", k, c, per, unpriced, cost[k], cost[k]/reqs[k], wantUnpriced)
			}
		}
	})

	t.Run("cost_per_conversation", func(t *testing.T) {
		rows, err := b.db.Conn().Query(ctx, query(t, "cost_per_conversation.sql", params))
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var id string
			var reqs, in, out uint64
			var turns uint32
			var c float64
			if err := rows.Scan(&id, &reqs, &turns, &c, &in, &out); err != nil {
				t.Fatal(err)
			}
			w := conv[id]
			if int(turns) != w.turns || int(reqs) != w.turns || !near(c, w.cost, 1e-9) {
				t.Fatalf("%s: %d requests, %d turns, cost %v; want %+v", id, reqs, turns, c, w)
			}
			n++
		}
		if n != len(conv) {
			t.Fatalf("%d conversations, want %d", n, len(conv))
		}
	})

	t.Run("conversations", func(t *testing.T) {
		var turns, completed, abandoned, withOutcome float64
		for _, c := range conv {
			turns += float64(c.turns)
			switch c.outcome {
			case events.OutcomeCompleted:
				completed++
				withOutcome++
			case events.OutcomeAbandoned:
				abandoned++
				withOutcome++
			}
		}
		var n, comp, aband uint64
		var avg, rate float64
		if err := b.db.Conn().QueryRow(ctx, query(t, "conversations.sql", params)).Scan(&n, &avg, &comp, &aband, &rate); err != nil {
			t.Fatal(err)
		}
		if int(n) != len(conv) || !near(avg, turns/float64(len(conv)), 1e-9) || float64(comp) != completed || float64(aband) != abandoned || !near(rate, completed/withOutcome, 1e-9) {
			t.Fatalf("got %d %v %d %d %v; want %d %v %v %v %v", n, avg, comp, aband, rate, len(conv), turns/float64(len(conv)), completed, abandoned, completed/withOutcome)
		}
	})
}

// TestMergedAccuracy240Windows writes 240 windows of lognormal TTFTs as the aggregator does
// and checks the P99 and P99.9 merged in SQL against the exact ones: within 1 % and 2 %.
func TestMergedAccuracy240Windows(t *testing.T) {
	b := newBed(t)
	if _, err := b.db.Migrate(context.Background(), schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(8, 9))
	base := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	agg := window.New(window.Config{Window: 15 * time.Second, Lateness: time.Second, Buckets: events.DefaultBucketBounds(), MaxSeries: 10}, nil)
	var all []float64
	seq := uint64(0)
	for w := range 240 {
		for range 1000 {
			ttft := math.Exp(math.Log(400) + 0.8*r.NormFloat64())
			all = append(all, ttft)
			seq++
			agg.Add(&events.RequestEvent{V: 1, EventID: "x", TS: base.Add(time.Duration(w) * 15 * time.Second), Model: "m", Scene: "s", Env: "e",
				InputTokens: 10, OutputTokens: 5, TTFTMs: ttft, TotalMs: ttft + 100, Status: events.StatusOK}, seq, base.Add(time.Duration(w)*15*time.Second))
		}
	}
	var rows []events.TokenRollup
	for _, u := range agg.Drain() {
		rows = agg.Rollups(u, rows)
	}
	if len(rows) != 240 {
		t.Fatalf("%d rows", len(rows))
	}
	sk := sink.New(b.db.Conn(), "accuracy")
	if err := sk.WriteTokenRollups(context.Background(), rows, agg.BucketLower, sink.Ledger{SeqThrough: seq, FlushID: "f"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	var n uint64
	var p99, p999 float64
	q := query(t, "merged_p99.sql", map[string]string{"from": dt(base), "to": dt(base.Add(time.Hour)), "model": "'m'"})
	if err := b.db.Conn().QueryRow(context.Background(), q).Scan(&n, &p99, &p999); err != nil {
		t.Fatal(err)
	}
	e99, e999 := math.Abs(p99/nearestRank(all, 0.99)-1), math.Abs(p999/nearestRank(all, 0.999)-1)
	t.Logf("240 windows × 1000 samples merged in ClickHouse: p99 error %.3f%%, p99.9 error %.3f%%", 100*e99, 100*e999)
	if n != 240_000 || e99 > 0.01 || e999 > 0.02 {
		t.Fatalf("n %d, p99 error %.3f%%, p99.9 error %.3f%%", n, 100*e99, 100*e999)
	}
}
