package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestLayersExactThroughPipeline publishes the same requests at the three layers — the
// gateway's event, the engine's (faster, with its queue, prefill and decode) and the app's
// (slower), each with its own event id and the request's trace id — interleaved, through
// the real NATS, the aggregator (restarted halfway) and ClickHouse: each layer's
// sum(requests), in token_rollups, in the rollups published on NATS and per bucket, is
// exactly the number of requests, the raw requests hold each trace once at each layer, and
// nothing is summed across layers.
func TestLayersExactThroughPipeline(t *testing.T) {
	b := newBed(t)
	const n = 3000
	r := rand.New(rand.NewPCG(15, 3))
	base := time.Now().UTC().Add(-3 * time.Minute).Truncate(15 * time.Second)
	buckets := events.DefaultBucketBounds()
	layers := []events.Layer{events.LayerGateway, events.LayerEngine, events.LayerApp}
	type key struct {
		layer  events.Layer
		bucket string
	}
	want := map[key]uint64{}
	wantOK := map[events.Layer]uint64{}
	var evs []events.RequestEvent
	for i := range n {
		in := int64(10 + r.IntN(40000))
		ttft := 50 + 0.05*float64(in)
		gw := events.RequestEvent{V: 1, TS: base.Add(time.Duration(i) * 40 * time.Millisecond), Model: []string{"qwen", "llama"}[i%2],
			Scene: []string{"chat", "search", "code"}[i%3], Env: "prod", Instance: "gpu-1", InputTokens: in, OutputTokens: int64(1 + r.IntN(300)),
			TTFTMs: ttft, TotalMs: ttft + 2000, Status: events.StatusOK, TraceID: fmt.Sprintf("%016x%016x", r.Uint64()|1, i)}
		if i%50 == 0 {
			gw.Status, gw.HTTPStatus = events.StatusError, 500
		}
		eng := gw
		eng.Layer, eng.TTFTMs, eng.TotalMs = events.LayerEngine, ttft-20, gw.TotalMs-30
		eng.QueueMs, eng.PrefillMs, eng.DecodeMs = 10, ttft-40, 1900
		app := gw
		app.Layer, app.TTFTMs, app.TotalMs = events.LayerApp, ttft+15, gw.TotalMs+15
		for _, e := range []events.RequestEvent{gw, eng, app} {
			e.EventID = events.NewEventID()
			evs = append(evs, e)
			l := e.Layer.OrGateway()
			want[key{l, buckets.Label(buckets.Index(e.InputTokens))}]++
			if e.Status == events.StatusOK {
				wantOK[l]++
			}
		}
	}
	r.Shuffle(len(evs), func(i, j int) { // layers arrive in any order, within a window or across
		if evs[i].TS.Sub(evs[j].TS).Abs() < 5*time.Second {
			evs[i], evs[j] = evs[j], evs[i]
		}
	})

	// What the aggregator publishes on rollup.tokens.>, by layer.
	var mu sync.Mutex
	published := map[events.Layer]uint64{}
	sub, err := b.nc.Subscribe("rollup.tokens.>", func(m *nats.Msg) {
		var ro events.TokenRollup
		if err := json.Unmarshal(m.Data, &ro); err != nil {
			t.Errorf("rollup %s: %v", m.Data, err)
			return
		}
		mu.Lock()
		published[ro.Layer] += ro.Requests
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	vars := b.env(envVars{"AGG_LOG_LEVEL": "warn"})
	stop := startAggregator(t, vars)
	b.publish(t, evs[:len(evs)/2])
	b.waitRows(t, time.Minute, uint64(len(evs)/2), "SELECT count() FROM requests")
	stop()
	startAggregator(t, vars)
	b.publish(t, evs[len(evs)/2:])
	b.waitRows(t, 2*time.Minute, uint64(len(evs)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT count() FROM requests")

	for _, l := range layers {
		if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups WHERE layer = ?", string(l)); got != n {
			t.Errorf("layer %s: sum(requests) = %d, want %d", l, got, n)
		}
		if got := b.scalar(t, "SELECT sum(ok) FROM token_rollups WHERE layer = ?", string(l)); got != wantOK[l] {
			t.Errorf("layer %s: sum(ok) = %d, want %d", l, got, wantOK[l])
		}
		if got := b.scalar(t, "SELECT uniqExact(trace_id) FROM requests WHERE layer = ?", string(l)); got != n {
			t.Errorf("layer %s: %d traces in requests, want %d", l, got, n)
		}
	}
	if got := b.scalar(t, "SELECT count() FROM (SELECT trace_id FROM requests GROUP BY trace_id HAVING count() = 3 AND uniqExact(layer) = 3)"); got != n {
		t.Errorf("%d traces stored once at each of the three layers, want %d", got, n)
	}
	if got := b.scalar(t, "SELECT count() FROM token_rollups WHERE layer NOT IN ('gateway', 'engine', 'app')"); got != 0 {
		t.Errorf("%d rollups of no layer", got)
	}
	rows, err := b.db.Conn().Query(context.Background(), "SELECT layer, bucket, sum(requests) FROM token_rollups GROUP BY layer, bucket")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for rows.Next() {
		var k key
		var layer string
		var got uint64
		if err := rows.Scan(&layer, &k.bucket, &got); err != nil {
			t.Fatal(err)
		}
		k.layer = events.Layer(layer)
		seen++
		if got != want[k] {
			t.Errorf("layer %s bucket %s: %d requests, want %d", k.layer, k.bucket, got, want[k])
		}
	}
	rows.Close()
	if seen != len(want) {
		t.Errorf("%d layer × bucket rows, want %d", seen, len(want))
	}
	// The rollups published once stored: every layer's, apart, once each (a restart
	// republishes nothing it had published).
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := map[events.Layer]uint64{}
		for l, v := range published {
			got[l] = v
		}
		mu.Unlock()
		if got[events.LayerGateway] == n && got[events.LayerEngine] == n && got[events.LayerApp] == n && len(got) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published rollups by layer %v, want %d each", got, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
