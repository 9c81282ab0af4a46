package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// centroids spreads n requests over five centroids around p95/1.6, so that a digest
// merged from them has its 95th percentile near p95.
func centroids(n uint64, p95 float64) ([]float64, []uint64) {
	med := p95 / 1.6
	means := []float64{0.6 * med, 0.85 * med, med, 1.2 * med, 1.6 * med}
	w := n / 5
	return means, []uint64{w, w, w, w, n - 4*w}
}

func tokenRollup(start time.Time, p95 float64) events.TokenRollup {
	const n = 200
	means, weights := centroids(n, p95)
	return events.TokenRollup{
		V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
		Env: "prod", Scene: "chat", Model: "llama-3.1-70b", Instance: "gpu-a", Bucket: "8000-31999",
		Requests: n, OK: n, OutputTokens: n * 100,
		TTFT: events.Latency{Count: n, P50: p95 / 1.6, P95: p95, P99: p95 * 1.2, Means: means, Weights: weights},
	}
}

// seedHistory writes a week of one-minute rollups around the current time of day, the
// TTFT p95 wobbling around 500 ms, as the aggregator would have.
func seedHistory(t *testing.T, ctx context.Context, db *chdb.DB, now time.Time) {
	t.Helper()
	b, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model,
		instance, bucket, requests, ok, output_tokens, ttft_count, ttft_p95, ttft_means, ttft_weights)`)
	if err != nil {
		t.Fatal(err)
	}
	for d := 1; d <= 7; d++ {
		for m := -40; m <= 40; m++ {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute).Truncate(time.Minute)
			p95 := 500 * (1 + 0.1*math.Sin(float64(d*100+m)))
			r := tokenRollup(start, p95)
			if err := b.Append(r.WindowStart, uint32(60), r.Kind, r.Env, r.Scene, r.Model, r.Instance, r.Bucket,
				r.Requests, r.OK, r.OutputTokens, r.TTFT.Count, r.TTFT.P95, r.TTFT.Means, r.TTFT.Weights); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

type amServer struct {
	mu     sync.Mutex
	posted []map[string]any
}

func (s *amServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/api/v2/alerts" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	var body []map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.posted = append(s.posted, body...)
	s.mu.Unlock()
}

func (s *amServer) states() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, a := range s.posted {
		if _, ok := a["endsAt"].(string); ok && a["labels"].(map[string]any)["alertname"] == "ttft_p95_dynamic" {
			out = append(out, a["endsAt"].(string))
		}
	}
	return out
}

type alerter struct {
	cancel context.CancelFunc
	done   chan error
}

func startAlerter(t *testing.T, environ map[string]string) *alerter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &alerter{cancel: cancel, done: make(chan error, 1)}
	go func() { a.done <- run(ctx, func(k string) string { return environ[k] }, io.Discard) }()
	t.Cleanup(func() { a.stop(t) })
	return a
}

func (a *alerter) stop(t *testing.T) {
	t.Helper()
	if a.cancel == nil {
		return
	}
	a.cancel()
	a.cancel = nil
	select {
	case err := <-a.done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the alerter did not stop in 30s")
	}
}

func waitFor(t *testing.T, what string, timeout time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRunEndToEnd runs the alerter against the real NATS and ClickHouse: a week of history
// in token_rollups gives the baseline, a TTFT surge published as rollups fires a dynamic
// alert, a restart in the middle of it does not fire it again, and the return to normal
// resolves it, on alerts.<severity>.<rule>, in the alerts table and at Alertmanager.
func TestRunEndToEnd(t *testing.T) {
	chCfg := testbed.ClickHouse(t)
	ns := testbed.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	seedHistory(t, ctx, db, now)

	am := &amServer{}
	amSrv := httptest.NewServer(am)
	defer amSrv.Close()

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []events.Alert
	sub, err := nc.Subscribe(events.SubjectAlertsAll, func(m *nats.Msg) {
		var a events.Alert
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Errorf("alert on %s is not JSON: %v", m.Subject, err)
			return
		}
		if m.Subject != events.AlertSubject(a.Severity, a.Rule) {
			t.Errorf("alert %s/%s on subject %s", a.Severity, a.Rule, m.Subject)
		}
		mu.Lock()
		got = append(got, a)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	alerts := func() []events.Alert {
		mu.Lock()
		defer mu.Unlock()
		return append([]events.Alert(nil), got...)
	}

	environ := map[string]string{
		"HTTP_ADDR":                "127.0.0.1:0",
		"NATS_URL":                 ns.ClientURL(),
		"CLICKHOUSE_ADDR":          chCfg.Addr,
		"CLICKHOUSE_DB":            chCfg.DB,
		"CLICKHOUSE_USER":          chCfg.User,
		"CLICKHOUSE_PASSWORD":      chCfg.Password,
		"ALERTER_SETTLE":           "200ms",
		"ALERTER_ALERTMANAGER_URL": amSrv.URL,
	}
	consumerReady := func() bool {
		_, err := js.Consumer(ctx, events.StreamRollups, "alerter")
		return err == nil
	}
	a := startAlerter(t, environ)
	waitFor(t, "the alerter's consumer", 30*time.Second, consumerReady)

	first := now.Add(-10 * time.Minute).Truncate(time.Minute)
	publish := func(i int, p95 float64) {
		t.Helper()
		r := tokenRollup(first.Add(time.Duration(i)*time.Minute), p95)
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, events.TokenRollupSubject(r.Env, r.Scene), data, jetstream.WithMsgID("w"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	// A malformed rollup is dead-lettered and counted, never evaluated.
	if _, err := js.Publish(ctx, events.TokenRollupSubject("prod", "chat"), []byte(`{"v":1,`)); err != nil {
		t.Fatal(err)
	}
	// Two windows of a TTFT p95 six times the baseline: pending, then firing.
	publish(0, 3000)
	publish(1, 3100)
	waitFor(t, "a firing alert", 30*time.Second, func() bool { return len(alerts()) >= 1 })
	fired := alerts()[0]
	if fired.State != events.AlertFiring || fired.Rule != "ttft_p95_dynamic" || fired.Severity != events.SeverityWarning {
		t.Fatalf("first alert = %s %s %s, want firing warning ttft_p95_dynamic", fired.State, fired.Severity, fired.Rule)
	}
	if fired.Labels["bucket"] != "8000-31999" || fired.Labels["scene"] != "chat" || fired.Value != 3100 {
		t.Errorf("firing alert labels %v value %v, want the long-input chat series at 3100", fired.Labels, fired.Value)
	}
	if fired.BaselineMethod != "median_mad" || fired.BaselineCenter < 400 || fired.BaselineCenter > 600 || fired.BaselineSpread <= 0 || fired.Threshold <= fired.BaselineCenter {
		t.Errorf("baseline %s center %v spread %v threshold %v, want median_mad near 500 ms", fired.BaselineMethod, fired.BaselineCenter, fired.BaselineSpread, fired.Threshold)
	}

	// Restart while it fires: the alert is restored from the ALERTS stream, not re-sent.
	a.stop(t)
	a = startAlerter(t, environ)
	waitFor(t, "the restarted alerter", 30*time.Second, consumerReady)
	time.Sleep(500 * time.Millisecond)
	publish(2, 3050)
	publish(3, 480)
	publish(4, 510)
	waitFor(t, "a resolved alert", 30*time.Second, func() bool { return len(alerts()) >= 2 })
	time.Sleep(300 * time.Millisecond)
	all := alerts()
	if len(all) != 2 || all[1].State != events.AlertResolved || all[1].Fingerprint != fired.Fingerprint {
		for _, x := range all {
			t.Logf("alert: %s %s %s at %s", x.State, x.Rule, x.Fingerprint, x.At)
		}
		t.Fatalf("got %d alerts, want firing then resolved of one fingerprint", len(all))
	}
	if !all[1].EndsAt.Equal(all[1].At) || !all[1].StartsAt.Equal(fired.StartsAt) {
		t.Errorf("resolved starts_at %s ends_at %s at %s; firing starts_at %s", all[1].StartsAt, all[1].EndsAt, all[1].At, fired.StartsAt)
	}

	// The rows: one per state change.
	waitFor(t, "two rows in alerts", 10*time.Second, func() bool {
		var n uint64
		err := db.Conn().QueryRow(ctx, "SELECT count() FROM alerts WHERE fingerprint = '"+fired.Fingerprint+"'").Scan(&n)
		return err == nil && n == 2
	})
	rows, err := db.Conn().Query(ctx, "SELECT state, rule, severity, scene, bucket, value, baseline_method FROM alerts ORDER BY at")
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for rows.Next() {
		var state, rule, sev, scene, bucket, method string
		var value float64
		if err := rows.Scan(&state, &rule, &sev, &scene, &bucket, &value, &method); err != nil {
			t.Fatal(err)
		}
		if rule != "ttft_p95_dynamic" || sev != "warning" || scene != "chat" || bucket != "8000-31999" || method != "median_mad" {
			t.Errorf("row %s %s %s %s %s %s", state, rule, sev, scene, bucket, method)
		}
		states = append(states, state)
	}
	rows.Close()
	if len(states) != 2 || states[0] != "firing" || states[1] != "resolved" {
		t.Errorf("alert rows %v, want [firing resolved]", states)
	}

	// Alertmanager got the firing alert (endsAt ahead, as Prometheus sends it) and the
	// resolution (endsAt = the time it resolved).
	waitFor(t, "Alertmanager posts", 10*time.Second, func() bool { return len(am.states()) >= 2 })
	ends := am.states()
	if e, _ := time.Parse(time.RFC3339, ends[0]); !e.After(fired.At) {
		t.Errorf("firing alert posted with endsAt %s, want after %s", ends[0], fired.At)
	}
	if e, _ := time.Parse(time.RFC3339, ends[len(ends)-1]); !e.Equal(all[1].At) {
		t.Errorf("resolved alert posted with endsAt %s, want %s", ends[len(ends)-1], all[1].At)
	}

	// A late subscriber can replay the ALERTS stream.
	stream, err := js.Stream(ctx, events.StreamAlerts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("ALERTS holds %d messages, want 2", info.State.Msgs)
	}
	a.stop(t)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test ran out of time")
	}
}
