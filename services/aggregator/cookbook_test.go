package main

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// cookbook returns a query of schemas/clickhouse/queries as written: {name:Type} parameters.
func cookbook(t *testing.T, name string) string {
	t.Helper()
	raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+name)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// server runs cookbook queries with their parameters bound: on 18.16 by chdb.Bind (the
// server cannot bind them), on a current ClickHouse by the server.
type server struct {
	name string
	run  func(sql string, params map[string]string) (*testbed.Result, error)
}

func server18(db *chdb.DB) server {
	return server{"18.16", func(sql string, params map[string]string) (*testbed.Result, error) {
		bound, err := chdb.Bind(sql, params)
		if err != nil {
			return nil, err
		}
		return testbed.Query(context.Background(), db.Conn(), bound)
	}}
}

func serverCurrent(c *testbed.Current) server {
	return server{c.Version, c.Query}
}

// current starts a current ClickHouse, migrates it as the services would and copies tables
// into it from the 18.16 database of b.
func current(t *testing.T, b *bed, tables ...string) *testbed.Current {
	t.Helper()
	c := testbed.CurrentClickHouse(t)
	ctx := context.Background()
	m, err := chdb.MigrateOn(ctx, c, c.DB, c.Version, schemas.Migrations())
	if err != nil {
		t.Fatal(err)
	}
	if !m.Features.LowCardinality || !m.Features.DateTime64 || !m.Features.TTL {
		t.Fatalf("ClickHouse %s: features %+v", c.Version, m.Features)
	}
	if err := testbed.CopyTables(ctx, b.db.Conn(), b.ch.DB, c, tables...); err != nil {
		t.Fatal(err)
	}
	return c
}

func dt(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol*math.Abs(want)+1e-9 }

// withinRank reports whether an estimated q-quantile of sorted lies between the exact
// quantiles at q−eps and q+eps: the fair test of a quantile sketch on a small sample, where
// neighbouring ranks can be far apart.
func withinRank(sorted []float64, q, eps, got float64) bool {
	lo, hi := nearestRank(sorted, max(q-eps, 0)), nearestRank(sorted, min(q+eps, 1))
	return got >= lo*(1-1e-6) && got <= hi*(1+1e-6)
}

// quantileColumns names the columns of res that hold t-digest quantiles (…_p50, …_p999).
func quantileColumns(res *testbed.Result) []string {
	var out []string
	for _, c := range res.Columns {
		if i := strings.LastIndex(c.Name, "_p"); i > 0 && strings.Trim(c.Name[i+2:], "0123456789") == "" {
			out = append(out, c.Name)
		}
	}
	return out
}

// Accessors of result values that fail the test on a value of another kind.
func num(t *testing.T, v any) float64 {
	t.Helper()
	switch x := v.(type) {
	case uint64:
		return float64(x)
	case int64:
		return float64(x)
	case float64:
		return x
	}
	t.Fatalf("%v (%T) is not a number", v, v)
	return 0
}

func str(t *testing.T, v any) string {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("%v (%T) is not a string", v, v)
	}
	return s
}

func tm(t *testing.T, v any) time.Time {
	t.Helper()
	x, ok := v.(time.Time)
	if !ok {
		t.Fatalf("%v (%T) is not a time", v, v)
	}
	return x
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
	// The engine's view of every other request, as its OTLP spans bring it: the cookbook
	// reads the gateway's, so the checks below, computed from evs alone, hold only if every
	// query keeps to its layer.
	// Every request has a trace; every other one an engine span and every fourth an app span
	// of the same trace, with known splits for trace_split.sql.
	all := slices.Clone(evs)
	for i := range evs {
		evs[i].TraceID = fmt.Sprintf("%016x%016x", r.Uint64()|1, i+1)
		all[i].TraceID = evs[i].TraceID
	}
	for i, e := range evs {
		if i%2 == 0 {
			g := e
			e.EventID, e.Layer, e.TTFTMs, e.TotalMs = events.NewEventID(), events.LayerEngine, g.TTFTMs/2, g.TotalMs*0.9
			e.QueueMs, e.PrefillMs, e.DecodeMs = e.TotalMs*0.1, e.TotalMs*0.2, e.TotalMs*0.6
			all = append(all, e)
		}
		if i%4 == 0 {
			e := evs[i]
			e.EventID, e.Layer, e.TTFTMs, e.TotalMs = events.NewEventID(), events.LayerApp, e.TTFTMs+12, e.TotalMs+12
			all = append(all, e)
		}
	}
	b.publish(t, all)
	b.waitRows(t, time.Minute, uint64(len(all)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, uint64(len(all)), "SELECT count() FROM requests")

	params := map[string]string{"from": dt(base), "to": dt(base.Add(time.Hour)), "model": "qwen2.5-72b", "limit": "1000", "layer": "gateway", "trace_id": "", "bucket": ""}
	buckets := events.DefaultBucketBounds()
	type ms struct{ model, scene string }

	checks := []struct {
		file  string
		check func(t *testing.T, res *testbed.Result)
	}{
		{"percentiles_by_bucket.sql", func(t *testing.T, res *testbed.Result) {
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
			for _, r := range res.Rows {
				k := key{str(t, r[0]), str(t, r[1]), str(t, r[2])}
				if reqs := uint64(num(t, r[3])); reqs != count[k] {
					t.Fatalf("%v: %d requests, want %d", k, reqs, count[k])
				}
				if len(ttft[k]) < 200 { // percentiles of a handful of samples say little
					continue
				}
				slices.Sort(ttft[k])
				slices.Sort(tpot[k])
				for i, q := range []float64{0.5, 0.95, 0.99} {
					if p := num(t, r[4+i]); !withinRank(ttft[k], q, 0.01, p) {
						t.Errorf("%v ttft p%g = %v, exact %v", k, q*100, p, nearestRank(ttft[k], q))
					}
					if p := num(t, r[7+i]); !withinRank(tpot[k], q, 0.01, p) {
						t.Errorf("%v tpot p%g = %v, exact %v", k, q*100, p, nearestRank(tpot[k], q))
					}
				}
			}
			if len(res.Rows) != len(count) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(count))
			}
		}},
		{"merged_p99.sql", func(t *testing.T, res *testbed.Result) {
			var xs []float64
			for _, e := range evs {
				if e.Model == "qwen2.5-72b" && (e.Status == events.StatusOK || e.OutputTokens > 0) {
					xs = append(xs, e.TTFTMs)
				}
			}
			slices.Sort(xs)
			if len(res.Rows) != 1 {
				t.Fatalf("%d rows", len(res.Rows))
			}
			n, p99, p999 := uint64(num(t, res.Rows[0][0])), num(t, res.Rows[0][1]), num(t, res.Rows[0][2])
			// 2,000 samples: rank tolerance; TestMergedAccuracy240Windows checks the relative error.
			if n != uint64(len(xs)) || !withinRank(xs, 0.99, 0.005, p99) || !withinRank(xs, 0.999, 0.002, p999) {
				t.Fatalf("n %d p99 %v p99.9 %v; exact n %d p99 %v p99.9 %v", n, p99, p999, len(xs), nearestRank(xs, 0.99), nearestRank(xs, 0.999))
			}
		}},
		{"tokens_per_second.sql", func(t *testing.T, res *testbed.Result) {
			type key struct {
				minute time.Time
				model  string
			}
			want := map[key]uint64{}
			for _, e := range evs {
				want[key{e.TS.Truncate(time.Minute), e.Model}] += uint64(e.OutputTokens)
			}
			for _, r := range res.Rows {
				k := key{tm(t, r[0]), str(t, r[1])}
				if outPS, w := num(t, r[2]), float64(want[k])/60; !near(outPS, w, 1e-9) {
					t.Fatalf("%v: %v tokens/s, want %v", k, outPS, w)
				}
			}
			if len(res.Rows) != len(want) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(want))
			}
		}},
		{"error_vs_timeout.sql", func(t *testing.T, res *testbed.Result) {
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
			for _, r := range res.Rows {
				k := ms{str(t, r[0]), str(t, r[1])}
				reqs, er, tr, cr, rl := num(t, r[2]), num(t, r[3]), num(t, r[4]), num(t, r[5]), num(t, r[6])
				w := want[k]
				if w == nil || reqs != w.reqs || !near(er, w.errs/w.reqs, 1e-9) || !near(tr, w.tos/w.reqs, 1e-9) || !near(rl, w.rl/w.reqs, 1e-9) || cr != 0 {
					t.Fatalf("%v: %v %v %v %v %v; want %+v", k, reqs, er, tr, cr, rl, w)
				}
			}
			if len(res.Rows) != len(want) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(want))
			}
		}},
		{"error_codes.sql", func(t *testing.T, res *testbed.Result) {
			want := map[string]uint64{}
			for _, e := range evs {
				if e.Status != events.StatusOK {
					want[string(e.Status)+"/"+e.ErrorCode]++
				}
			}
			got := map[string]uint64{}
			for _, r := range res.Rows {
				got[str(t, r[0])+"/"+str(t, r[1])] = uint64(num(t, r[2]))
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		}},
		{"prefix_cache.sql", func(t *testing.T, res *testbed.Result) {
			cached, input := map[string]float64{}, map[string]float64{}
			for _, e := range evs {
				cached[e.Model] += float64(e.CachedInputTokens)
				input[e.Model] += float64(e.InputTokens)
			}
			for _, r := range res.Rows {
				model, c, rate := str(t, r[0]), num(t, r[1]), num(t, r[3])
				if c != cached[model] || !near(rate, cached[model]/input[model], 1e-9) {
					t.Fatalf("%s: %v cached, rate %v; want %v, %v", model, c, rate, cached[model], cached[model]/input[model])
				}
			}
			if len(res.Rows) != len(cached) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(cached))
			}
		}},
		{"cost_per_request.sql", func(t *testing.T, res *testbed.Result) {
			cost, reqs := map[ms]float64{}, map[ms]float64{}
			for _, e := range evs {
				k := ms{e.Model, e.Scene}
				reqs[k]++
				if e.Model == "qwen2.5-72b" {
					cost[k] += (float64(e.InputTokens-e.CachedInputTokens)*0.4 + float64(e.CachedInputTokens)*0.1 + float64(e.OutputTokens)*1.2) / 1e6
				}
			}
			for _, r := range res.Rows {
				k := ms{str(t, r[0]), str(t, r[1])}
				n, c, per, unpriced := num(t, r[2]), num(t, r[3]), num(t, r[4]), num(t, r[5])
				wantUnpriced := 0.0
				if k.model != "qwen2.5-72b" {
					wantUnpriced = n
				}
				if !near(c, cost[k], 1e-9) || !near(per, cost[k]/reqs[k], 1e-9) || unpriced != wantUnpriced {
					t.Fatalf("%v: cost %v per %v unpriced %v; want %v %v %v", k, c, per, unpriced, cost[k], cost[k]/reqs[k], wantUnpriced)
				}
			}
			if len(res.Rows) != len(reqs) {
				t.Fatalf("%d rows, want %d", len(res.Rows), len(reqs))
			}
		}},
		{"cost_per_conversation.sql", func(t *testing.T, res *testbed.Result) {
			for _, r := range res.Rows {
				id, reqs, turns, c := str(t, r[1]), num(t, r[2]), num(t, r[3]), num(t, r[4]) // r[0]: env
				w := conv[id]
				if int(turns) != w.turns || int(reqs) != w.turns || !near(c, w.cost, 1e-9) {
					t.Fatalf("%s: %v requests, %v turns, cost %v; want %+v", id, reqs, turns, c, w)
				}
			}
			if len(res.Rows) != len(conv) {
				t.Fatalf("%d conversations, want %d", len(res.Rows), len(conv))
			}
		}},
		{"trace_split.sql", func(t *testing.T, res *testbed.Result) {
			checkTraceSplit(t, res, wantTraceSplit(all, buckets, ""))
		}},
		{"conversations.sql", func(t *testing.T, res *testbed.Result) {
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
			if len(res.Rows) != 1 {
				t.Fatalf("%d rows", len(res.Rows))
			}
			r := res.Rows[0]
			n, avg, comp, aband, rate := num(t, r[0]), num(t, r[1]), num(t, r[2]), num(t, r[3]), num(t, r[4])
			if int(n) != len(conv) || !near(avg, turns/float64(len(conv)), 1e-9) || comp != completed || aband != abandoned || !near(rate, completed/withOutcome, 1e-9) {
				t.Fatalf("got %v %v %v %v %v; want %d %v %v %v %v", n, avg, comp, aband, rate, len(conv), turns/float64(len(conv)), completed, abandoned, completed/withOutcome)
			}
		}},
	}
	files, err := fs.Glob(schemas.Queries, "clickhouse/queries/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	// Queries over tables this test does not fill are checked by their own tests.
	elsewhere := map[string]string{"engine_efficiency.sql": "TestEngineEfficiencyQuery",
		"ttft_vs_queue.sql": "cli/internal/report TestCookbookEngineQueries", "engine_prefix_cache.sql": "cli/internal/report TestCookbookEngineQueries"}
	for _, f := range files {
		if _, ok := elsewhere[filepath.Base(f)]; ok {
			continue
		}
		if businessQueries[filepath.Base(f)] {
			continue // checked by TestFeedbackThroughAggregator
		}
		if !slices.ContainsFunc(checks, func(c struct {
			file  string
			check func(t *testing.T, res *testbed.Result)
		}) bool {
			return c.file == filepath.Base(f)
		}) {
			t.Errorf("%s has no check here", f)
		}
	}

	answers := map[string]*testbed.Result{}
	old := server18(b.db)
	for _, c := range checks {
		t.Run(c.file, func(t *testing.T) {
			res, err := old.run(cookbook(t, c.file), params)
			if err != nil {
				t.Fatal(err)
			}
			answers[c.file] = res
			c.check(t, res)
		})
	}
	// The same rows on a current ClickHouse, the same queries bound by the server: the same
	// checks, and the same answers as 18.16's.
	// One trace, with all three layers, and one bucket: the same split from that trace's rows
	// alone, or that bucket's.
	one := maps.Clone(params)
	one["trace_id"] = evs[0].TraceID
	oneBucket := maps.Clone(params)
	oneBucket["bucket"] = buckets.Label(buckets.Index(evs[0].InputTokens))
	splitCheck := func(t *testing.T, srv server) {
		res, err := srv.run(cookbook(t, "trace_split.sql"), one)
		if err != nil {
			t.Fatal(err)
		}
		want := wantTraceSplit(all, buckets, evs[0].TraceID)
		if w := want[oneBucket["bucket"]]; len(w) == 0 || w[0] != 1 || w[1] != 1 || w[2] != 1 || !near(w[3], 12, 1e-9) {
			t.Fatalf("the first trace's split %v lacks a layer", w)
		}
		checkTraceSplit(t, res, want)
		res, err = srv.run(cookbook(t, "trace_split.sql"), oneBucket)
		if err != nil {
			t.Fatal(err)
		}
		all := wantTraceSplit(all, buckets, "")
		checkTraceSplit(t, res, map[string][]float64{oneBucket["bucket"]: all[oneBucket["bucket"]]})
	}
	t.Run("trace_split one trace", func(t *testing.T) { splitCheck(t, old) })
	t.Run("current", func(t *testing.T) {
		cur := serverCurrent(current(t, b, "requests", "token_rollups"))
		t.Run("trace_split one trace", func(t *testing.T) { splitCheck(t, cur) })
		for _, c := range checks {
			t.Run(c.file, func(t *testing.T) {
				res, err := cur.run(cookbook(t, c.file), params)
				if err != nil {
					t.Fatalf("ClickHouse %s: %v", cur.name, err)
				}
				c.check(t, res)
				if want := answers[c.file]; want != nil {
					// Current servers read t-digest quantiles off singleton centroids exactly where
					// 18.16 interpolates: both are checked against the exact quantiles above.
					if err := testbed.Compare(want, res, 1e-9, quantileColumns(res)...); err != nil {
						t.Errorf("ClickHouse %s answers otherwise than 18.16: %v", cur.name, err)
					}
				}
			})
		}
	})
}

// wantTraceSplit computes what trace_split.sql answers for evs, all of one trace when
// trace is set: per bucket, the columns after bucket.
func wantTraceSplit(evs []events.RequestEvent, buckets events.Buckets, trace string) map[string][]float64 {
	byTrace := map[string]map[events.Layer]events.RequestEvent{}
	for _, e := range evs {
		if e.TraceID == "" || trace != "" && e.TraceID != trace {
			continue
		}
		if byTrace[e.TraceID] == nil {
			byTrace[e.TraceID] = map[events.Layer]events.RequestEvent{}
		}
		byTrace[e.TraceID][e.Layer.OrGateway()] = e
	}
	type acc struct{ traces, withApp, withEngine, app, gw, queue, prefill, decode, other, appTTFT, gwTTFT, engTTFT, nApp, nGW, nEng float64 }
	per := map[string]*acc{}
	for _, l := range byTrace {
		app, hasApp := l[events.LayerApp]
		gw, hasGW := l[events.LayerGateway]
		eng, hasEng := l[events.LayerEngine]
		b := buckets.Label(buckets.Index(gw.InputTokens))
		a := per[b]
		if a == nil {
			a = &acc{}
			per[b] = a
		}
		a.traces++
		if hasApp && hasGW {
			a.withApp++
			a.app += app.TotalMs - gw.TotalMs
		}
		if hasGW && hasEng {
			a.withEngine++
			a.gw += gw.TotalMs - eng.TotalMs
		}
		if hasEng {
			a.nEng++
			a.queue += eng.QueueMs
			a.prefill += eng.PrefillMs
			a.decode += eng.DecodeMs
			a.other += eng.TotalMs - eng.QueueMs - eng.PrefillMs - eng.DecodeMs
			a.engTTFT += eng.TTFTMs
		}
		if hasApp {
			a.nApp++
			a.appTTFT += app.TTFTMs
		}
		if hasGW {
			a.nGW++
			a.gwTTFT += gw.TTFTMs
		}
	}
	out := map[string][]float64{}
	for b, a := range per {
		out[b] = []float64{a.traces, a.withApp, a.withEngine, a.app / a.withApp, a.gw / a.withEngine,
			a.queue / a.nEng, a.prefill / a.nEng, a.decode / a.nEng, a.other / a.nEng,
			a.appTTFT / a.nApp, a.gwTTFT / a.nGW, a.engTTFT / a.nEng}
	}
	return out
}

func checkTraceSplit(t *testing.T, res *testbed.Result, want map[string][]float64) {
	t.Helper()
	if len(res.Rows) != len(want) {
		t.Fatalf("%d buckets, want %d", len(res.Rows), len(want))
	}
	for _, r := range res.Rows {
		b := str(t, r[0])
		w, ok := want[b]
		if !ok {
			t.Fatalf("bucket %s unexpected", b)
		}
		for i, x := range w {
			got := num(t, r[i+1])
			if math.IsNaN(x) && math.IsNaN(got) {
				continue
			}
			if !near(got, x, 1e-9) {
				t.Errorf("bucket %s, %s = %v, want %v", b, res.Columns[i+1].Name, got, x)
			}
		}
	}
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
	params := map[string]string{"from": dt(base), "to": dt(base.Add(time.Hour)), "model": "m", "layer": "gateway"}
	check := func(t *testing.T, srv server) {
		res, err := srv.run(cookbook(t, "merged_p99.sql"), params)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) != 1 {
			t.Fatalf("%d rows", len(res.Rows))
		}
		n, p99, p999 := num(t, res.Rows[0][0]), num(t, res.Rows[0][1]), num(t, res.Rows[0][2])
		e99, e999 := math.Abs(p99/nearestRank(all, 0.99)-1), math.Abs(p999/nearestRank(all, 0.999)-1)
		t.Logf("240 windows × 1000 samples merged in ClickHouse %s: p99 error %.3f%%, p99.9 error %.3f%%", srv.name, 100*e99, 100*e999)
		if n != 240_000 || e99 > 0.01 || e999 > 0.02 {
			t.Fatalf("n %v, p99 error %.3f%%, p99.9 error %.3f%%", n, 100*e99, 100*e999)
		}
	}
	check(t, server18(b.db))
	t.Run("current", func(t *testing.T) { check(t, serverCurrent(current(t, b, "token_rollups"))) })
}
