package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/deploy/internal/dashboard"
	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

const datasourceUID = "tokenscope-clickhouse"

// TestDashboardStructure checks what Grafana needs besides the SQL: every panel queries the
// provisioned data source, time series return time-series frames, tables tables.
func TestDashboardStructure(t *testing.T) {
	prov, err := os.ReadFile("grafana/provisioning/datasources/clickhouse.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"uid: " + datasourceUID, "type: grafana-clickhouse-datasource", "host: clickhouse", "port: 9000", "protocol: native",
		"username: $CLICKHOUSE_USER", "defaultDatabase: $CLICKHOUSE_DB", "password: $CLICKHOUSE_PASSWORD"} {
		if !strings.Contains(string(prov), want) {
			t.Errorf("datasource provisioning lacks %q", want)
		}
	}
	d := loadDashboard(t)
	if len(d.Panels) < 15 {
		t.Fatalf("%d panels", len(d.Panels))
	}
	// The business panels TestDashboardQueries checks by title.
	for title := range businessWant {
		if !slices.ContainsFunc(d.Panels, func(p dashboard.Panel) bool { return p.Title == title }) {
			t.Errorf("no panel %q", title)
		}
	}
	for _, p := range d.Panels {
		if len(p.Queries) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Queries {
			// The same requests seen at two layers must never be summed: a panel over
			// requests reads the one layer selected.
			if reads := strings.Contains(q.SQL, "token_rollups") || strings.Contains(q.SQL, "FROM requests"); reads &&
				strings.Count(q.SQL, "layer = '${layer}'") != strings.Count(q.SQL, "token_rollups")+strings.Count(q.SQL, "FROM requests") {
				t.Errorf("panel %q does not read the selected layer from each of its tables:\n%s", p.Title, q.SQL)
			}
			if q.Datasource.UID != datasourceUID || p.Datasource.UID != datasourceUID {
				t.Errorf("panel %q does not use data source %s", p.Title, datasourceUID)
			}
			switch p.Type {
			case "timeseries":
				if q.QueryType != "timeSeries" || q.Format != 0 {
					t.Errorf("time series panel %q: query type %q format %d", p.Title, q.QueryType, q.Format)
				}
			case "table", "stat":
				if q.QueryType != "table" || q.Format != 1 {
					t.Errorf("%s panel %q: query type %q format %d", p.Type, p.Title, q.QueryType, q.Format)
				}
			default:
				t.Errorf("panel %q: type %s", p.Title, p.Type)
			}
		}
	}
}

func loadDashboard(t *testing.T) dashboard.Dashboard {
	t.Helper()
	d, err := dashboard.Load("grafana/dashboards/tokenscope.json")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// buildService builds a service the way its Dockerfile does.
func buildService(t *testing.T, dir, name string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, ".")
	cmd.Dir = filepath.Join(repoRoot, "services", name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build %s: %v\n%s", name, err, b)
	}
	return out
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startService runs a built service with exactly environ, and stops it with SIGTERM when
// the test ends; its output is logged if the test failed.
func startService(t *testing.T, bin string, environ map[string]string) {
	t.Helper()
	cmd := exec.Command(bin)
	for k, v := range environ {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", filepath.Base(bin), err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not stop within 30s of SIGTERM", filepath.Base(bin))
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), out.String())
		}
	})
}

// waitFor polls cond until it is true, failing after timeout with what it says.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s (%s)", what, timeout, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func scalar(ctx context.Context, db *chdb.DB, q string) (uint64, error) {
	var n uint64
	err := db.Conn().QueryRow(ctx, q).Scan(&n)
	return n, err
}

// traffic is the workload the pipeline is fed: windows of mixed traffic on two models, two
// scenes, four input buckets and two instances, with errors, 429s and timeouts; then a
// TTFT surge on one series, long enough for the alerter's TTFT SLA rules to fire.
type traffic struct {
	requests []events.RequestEvent
	samples  []events.GPUSample
	engines  []events.EngineSample // each host's vLLM, every 5 s
	surge    events.RequestEvent   // one event of the surge series
	feedback []events.FeedbackEvent
}

// Prices of the test's models, USD per million tokens: a business request (1000 input
// tokens, none cached, 500 output) costs 0.002 on llama-3-70b and 0.004 on qwen2.5-72b.
const testPrices = `[{"model": "llama-3-70b", "input": 1, "output": 2}, {"model": "qwen2.5-72b", "input": 2, "output": 4}]`

// addBusiness adds four conversations, their requests within the minute from t0 (a whole
// minute: one point of every time series), their outcomes, and verdicts a minute later, so
// that the business panels' answers are known by hand:
//
//	conv-1 chat   llama  turns 1, 2, 3   completed  thumbs up on turn 1, on turn 3 down then up; quality 0.5, 0.9
//	conv-2 chat   qwen   turns 1, 2      abandoned  thumbs down on turn 2 (sent twice); quality 0.4
//	conv-3 search llama  two, no turn    completed  thumbs up on the conversation; quality 0.7
//	conv-4 search qwen   turns 1,1,2,3,4 completed  unrated; quality 0.6, and 0.8 on the conversation
//
// conv-1 and conv-2 report their outcome on a request (conv-2's task_completed verdict of 1
// loses to it); conv-3 and conv-4 carry none, as an app behind the gateway proxy cannot, and
// report it as task_completed verdicts: conv-3 on its first request, conv-4 on the
// conversation, abandoned then changed to completed.
//
// TTFT: conv-1's first two turns 300 ms, its third 1500 ms; conv-2 3000 ms; conv-3 300 ms;
// conv-4 1500 ms. Every request is 1000 input tokens and 500 output.
func (tr *traffic) addBusiness(t0 time.Time) {
	n := 0
	req := func(conv, scene, model string, turn int, ttft float64, outcome events.Outcome) string {
		n++
		e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: t0.Add(time.Duration(n) * 2 * time.Second),
			Model: model, Instance: "vllm-a:8000", Scene: scene, Env: "prod", Provider: "openai", Stream: true,
			InputTokens: 1000, OutputTokens: 500, TTFTMs: ttft, TotalMs: ttft + 20*499, Status: events.StatusOK,
			ConversationID: conv, Turn: turn, Outcome: outcome}
		tr.requests = append(tr.requests, e)
		return e.EventID
	}
	verdict := func(request, conv, scene, name string, value float64, source events.FeedbackSource, after time.Duration) {
		tr.feedback = append(tr.feedback, events.FeedbackEvent{V: 1, EventID: events.NewEventID(), TS: t0.Add(time.Minute + after),
			RequestID: request, ConversationID: conv, Name: name, Value: value, Source: source, Env: "prod", Scene: scene})
	}
	const llama, qwen = "llama-3-70b", "qwen2.5-72b"
	r1a := req("conv-1", "chat", llama, 1, 300, "")
	req("conv-1", "chat", llama, 2, 300, "")
	r1c := req("conv-1", "chat", llama, 3, 1500, events.OutcomeCompleted)
	req("conv-2", "chat", qwen, 1, 3000, "")
	r2b := req("conv-2", "chat", qwen, 2, 3000, events.OutcomeAbandoned)
	r3a := req("conv-3", "search", llama, 0, 300, "")
	req("conv-3", "search", llama, 0, 300, "")
	req("conv-4", "search", qwen, 1, 1500, "")
	req("conv-4", "search", qwen, 1, 1500, "")
	req("conv-4", "search", qwen, 2, 1500, "")
	req("conv-4", "search", qwen, 3, 1500, "")
	r4e := req("conv-4", "search", qwen, 4, 1500, "")

	verdict(r1a, "", "chat", "thumbs", 1, events.SourceUser, 0)
	verdict(r1c, "", "chat", "thumbs", 0, events.SourceUser, time.Second)
	verdict(r1c, "", "chat", "thumbs", 1, events.SourceUser, 3*time.Second) // changed: the latest counts
	verdict(r2b, "", "chat", "thumbs", 0, events.SourceUser, 0)
	tr.feedback = append(tr.feedback, tr.feedback[len(tr.feedback)-1]) // sent twice: counts once
	verdict("", "conv-3", "search", "thumbs", 1, events.SourceUser, 0)
	verdict(r1a, "", "chat", "quality", 0.5, events.SourceEvaluator, 0)
	verdict(r1c, "", "chat", "quality", 0.9, events.SourceEvaluator, 0)
	verdict(r2b, "", "chat", "quality", 0.4, events.SourceEvaluator, 0)
	verdict(r3a, "", "search", "quality", 0.7, events.SourceEvaluator, 0)
	verdict(r4e, "", "search", "quality", 0.6, events.SourceEvaluator, 0)
	verdict("", "conv-4", "search", "quality", 0.8, events.SourceEvaluator, 0)
	verdict(r2b, "", "chat", "task_completed", 1, events.SourceUser, 0) // its request's outcome wins
	verdict(r3a, "", "search", "task_completed", 1, events.SourceUser, 0)
	verdict("", "conv-4", "search", "task_completed", 0, events.SourceUser, 0)
	verdict("", "conv-4", "search", "task_completed", 1, events.SourceUser, 2*time.Second) // changed: the latest counts
}

func makeTraffic(base time.Time, windows, surgeWindows int) traffic {
	const window = 15 * time.Second
	var tr traffic
	models := []string{"llama-3-70b", "qwen2.5-72b"}
	instances := []string{"vllm-a:8000", "vllm-b:8000"}
	scenes := []string{"chat", "search"}
	inputs := []int64{200, 1200, 5000, 12000}
	n := 0
	for w := range windows + surgeWindows {
		start := base.Add(time.Duration(w) * window)
		for i := range 32 {
			n++
			in := inputs[(i/4)%4] + int64(n%97)
			out := int64(40 + (n*37)%300)
			ttft := 80 + 0.04*float64(in) + float64(n%13)*7
			tpot := 18 + float64(n%11)
			e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: start.Add(time.Duration(i) * 400 * time.Millisecond),
				Model: models[i%2], Instance: instances[i%2], Scene: scenes[(i/2)%2], Env: "prod", Provider: "openai", Stream: true,
				InputTokens: in, OutputTokens: out, CachedInputTokens: in / 3,
				TTFTMs: ttft, TotalMs: ttft + tpot*float64(out-1), Status: events.StatusOK}
			switch {
			case n%17 == 0:
				e.Status, e.ErrorCode, e.HTTPStatus = events.StatusError, "500", 500
			case n%23 == 0:
				e.Status, e.ErrorCode, e.HTTPStatus = events.StatusError, "429", 429
			case n%29 == 0:
				e.Status, e.ErrorCode = events.StatusTimeout, "stream_idle"
			}
			tr.requests = append(tr.requests, e)
		}
		if w < windows {
			continue
		}
		for i := range 40 {
			n++
			e := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: start.Add(time.Duration(i) * 300 * time.Millisecond),
				Model: "llama-3-70b", Instance: "vllm-a:8000", Scene: "chat", Env: "prod", Provider: "openai", Stream: true,
				InputTokens: 1000 + int64(i), OutputTokens: 200, TTFTMs: 7000 + float64(i)*10, Status: events.StatusOK}
			e.TotalMs = e.TTFTMs + 30*199
			tr.requests = append(tr.requests, e)
			tr.surge = e
		}
	}
	energy := map[string]float64{}
	for ts := base; ts.Before(base.Add(time.Duration(windows+surgeWindows) * window)); ts = ts.Add(5 * time.Second) {
		for h, host := range instances {
			for g := range 2 {
				key := fmt.Sprintf("%s/%d", host, g)
				util := 40 + float64((int(ts.Unix())/5+h*3+g)%50)
				power := 100 + 5*util
				energy[key] += power * 5
				mem, total := uint64(60e9), uint64(141e9)
				e := energy[key]
				tr.samples = append(tr.samples, events.GPUSample{V: 1, TS: ts, Host: host, GPUIndex: g,
					GPUUUID: fmt.Sprintf("GPU-%d-%d", h, g), GPUName: "NVIDIA H200", Source: "replay",
					UtilGPUPct: &util, PowerW: &power, EnergyJ: &e, MemUsedBytes: &mem, MemTotalBytes: &total})
			}
			// The host's vLLM: a queue that grows in the surge, 25 % of prompt tokens in the
			// prefix cache; the first host preempts a request every 10 s.
			k := int(ts.Unix()/5) + h
			surge := ts.Sub(base) >= time.Duration(windows)*window
			waiting, running, kv := float64(k%3), 8.0, 0.4+float64(k%5)/10
			queueCounts := []float64{4, 1, 0, 0, 0}
			if surge {
				waiting, kv, queueCounts = 30, 0.97, []float64{0, 0, 1, 4, 0}
			}
			sec, queries, hits, pre := 5.0, 4000.0, 1000.0, float64(k%2*(1-h))
			prompt, gen := 4000.0, 600.0
			tr.engines = append(tr.engines, events.EngineSample{V: 1, TS: ts, Host: host, Engine: events.EngineVLLM, Name: "vllm", Model: "llama-3-70b", Up: true,
				DeltaSeconds: &sec, Running: &running, Waiting: &waiting, KVCacheUsage: &kv,
				PrefixCacheQueries: &queries, PrefixCacheHits: &hits, Preemptions: &pre, PromptTokens: &prompt, GenerationTokens: &gen,
				QueueTime:   &events.HistogramDelta{Le: []float64{0.5, 1, 2, 5}, Counts: queueCounts, Count: 5, Sum: 1},
				PrefillTime: &events.HistogramDelta{Le: []float64{0.5, 1, 2, 5}, Counts: []float64{5, 0, 0, 0, 0}, Count: 5, Sum: 1}})
		}
	}
	return tr
}

func publish(t *testing.T, js jetstream.JetStream, tr traffic) {
	t.Helper()
	var futures []jetstream.PubAckFuture
	wait := func() {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			case <-time.After(20 * time.Second):
				t.Fatal("publish acknowledgement timed out")
			}
		}
		futures = futures[:0]
	}
	add := func(msg *nats.Msg) {
		f, err := js.PublishMsgAsync(msg)
		if err != nil {
			t.Fatal(err)
		}
		if futures = append(futures, f); len(futures) == 1000 {
			wait()
		}
	}
	for i := range tr.requests {
		e := &tr.requests[i]
		msg := nats.NewMsg(events.RequestSubject(e.Env, e.Scene))
		msg.Data = events.AppendRequest(nil, e)
		msg.Header.Set(jetstream.MsgIDHeader, e.EventID)
		add(msg)
	}
	for _, s := range tr.samples {
		msg := nats.NewMsg(events.GPUSampleSubject(s.Host))
		data, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		msg.Data = data
		msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s/%s/%d", s.Host, s.GPUUUID, s.TS.UnixMilli()))
		add(msg)
	}
	for i := range tr.engines {
		s := &tr.engines[i]
		data, err := events.MarshalEngineSample(s)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(events.EngineSampleSubject(s.Host))
		msg.Data = data
		msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("engine/%s/%s/%s/%d", s.Host, s.Name, s.Model, s.TS.UnixMilli()))
		add(msg)
	}
	for i := range tr.feedback {
		f := &tr.feedback[i]
		msg := nats.NewMsg(events.FeedbackSubject(f.Env, f.Scene))
		msg.Data = events.AppendFeedback(nil, f)
		msg.Header.Set(jetstream.MsgIDHeader, f.EventID)
		add(msg)
	}
	wait()
}

// TestDashboardQueries runs the pipeline (the aggregator and the alerter, built as their
// images are) over NATS and ClickHouse, then every query of the dashboard, its variables
// and macros filled in as Grafana and the ClickHouse plugin fill them, and requires rows.
func TestDashboardQueries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the aggregator and the alerter")
	}
	d := loadDashboard(t)
	chCfg := testbed.ClickHouse(t)
	ns := testbed.NATS(t)
	bin := t.TempDir()
	aggregator := buildService(t, bin, "aggregator")
	alerter := buildService(t, bin, "alerter")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	common := map[string]string{"NATS_URL": ns.ClientURL(), "CLICKHOUSE_ADDR": chCfg.Addr, "CLICKHOUSE_HTTP_ADDR": chCfg.HTTPAddr, "CLICKHOUSE_DB": chCfg.DB,
		"CLICKHOUSE_USER": chCfg.User, "CLICKHOUSE_PASSWORD": chCfg.Password, "HTTP_ADDR": "127.0.0.1:0"}
	env := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	prices := filepath.Join(bin, "prices.json")
	if err := os.WriteFile(prices, []byte(testPrices), 0o644); err != nil {
		t.Fatal(err)
	}
	startService(t, aggregator, env(map[string]string{"AGG_WINDOW": "15s", "AGG_LATENESS": "2s", "AGG_FLUSH_INTERVAL": "200ms", "AGG_PRICES": prices}))

	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitFor(t, time.Minute, "the aggregator migrates ClickHouse", func() (bool, string) {
		_, err := scalar(ctx, db, "SELECT count() FROM alerts")
		return err == nil, fmt.Sprint(err)
	})
	startService(t, alerter, env(map[string]string{"ALERTER_SETTLE": "1s"}))

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	// The alerter reads rollups published after its consumer exists.
	waitFor(t, time.Minute, "the alerter's consumer", func() (bool, string) {
		_, err := js.Consumer(ctx, events.StreamRollups, "alerter")
		return err == nil, fmt.Sprint(err)
	})

	base := time.Now().UTC().Add(-20 * time.Minute).Truncate(time.Minute)
	tr := makeTraffic(base, 40, 4)
	tr.addBusiness(base.Add(2 * time.Minute))
	publish(t, js, tr)
	// The engine's view of the same requests, faster: the panels read the layer selected
	// (gateway), so checkPanel's figures, from tr alone, hold only if every panel keeps to it.
	engine := traffic{requests: slices.Clone(tr.requests)}
	for i := range engine.requests {
		e := &engine.requests[i]
		e.EventID, e.Layer, e.TTFTMs = events.NewEventID(), events.LayerEngine, e.TTFTMs/4
	}
	publish(t, js, engine)

	counts := []struct {
		q    string
		want uint64
	}{
		{"SELECT sum(requests) FROM token_rollups WHERE layer = 'gateway'", uint64(len(tr.requests))},
		{"SELECT sum(requests) FROM token_rollups WHERE layer = 'engine'", uint64(len(tr.requests))},
		{"SELECT count() FROM requests", 2 * uint64(len(tr.requests))},
		{"SELECT sum(samples) FROM gpu_rollups", uint64(len(tr.samples))},
		{"SELECT sum(samples) FROM engine_rollups", uint64(len(tr.engines))},
		{"SELECT uniqExact(event_id) FROM feedback", uint64(len(tr.feedback) - 1)},
	}
	for _, c := range counts {
		waitFor(t, 2*time.Minute, c.q, func() (bool, string) {
			n, err := scalar(ctx, db, c.q)
			return err == nil && n == c.want, fmt.Sprintf("%d of %d, %v", n, c.want, err)
		})
	}
	waitFor(t, 2*time.Minute, "the alerter fires the TTFT SLA alerts of the surge", func() (bool, string) {
		n, err := scalar(ctx, db, "SELECT count() FROM alerts WHERE state = 'firing' AND rule = 'ttft_p95_sla' AND scene = 'chat'")
		return err == nil && n >= 2, fmt.Sprintf("%d firing, %v", n, err)
	})

	r := dashboard.Range{From: base.Add(-time.Minute), To: time.Now().UTC().Add(time.Minute)}
	options := map[string][]string{}
	var allSel, oneSel = map[string][]string{}, map[string][]string{}
	for _, v := range d.Variables {
		if v.Name == "layer" {
			allSel[v.Name], oneSel[v.Name] = []string{"gateway"}, []string{"gateway"}
			options[v.Name] = v.Values
			continue
		}
		if v.Type == "custom" {
			allSel[v.Name], oneSel[v.Name] = v.Values[1:2], v.Values[len(v.Values)-1:]
			options[v.Name] = v.Values
			continue
		}
		sql, err := dashboard.Expand(v.SQL, r)
		if err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		rows := query(t, ctx, db, sql)
		for _, row := range rows {
			options[v.Name] = append(options[v.Name], fmt.Sprint(row[0]))
		}
		if len(options[v.Name]) == 0 {
			t.Fatalf("variable %s: no values from %s", v.Name, sql)
		}
		allSel[v.Name] = []string{dashboard.AllValue}
	}
	oneSel["env"], oneSel["scene"], oneSel["model"], oneSel["host"] = []string{tr.surge.Env}, []string{tr.surge.Scene}, []string{tr.surge.Model}, []string{tr.surge.Instance}
	for name, want := range map[string][]string{"env": {"prod"}, "scene": {"chat", "search"}, "model": {"llama-3-70b", "qwen2.5-72b"}, "host": {"vllm-a:8000", "vllm-b:8000"}} {
		if !reflect.DeepEqual(options[name], want) {
			t.Errorf("variable %s offers %v, want %v", name, options[name], want)
		}
	}

	cases := []struct {
		name     string
		sel      map[string][]string
		interval time.Duration
	}{
		{"all, 1s interval", allSel, time.Second},
		{"one of each, 1s interval", oneSel, time.Second},
		{"all, 5m interval", allSel, 5 * time.Minute},
	}
	answers := map[string]*testbed.Result{} // by case, panel and query
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.Interval = c.interval
			for _, p := range d.Panels {
				for _, q := range p.Queries {
					sql, err := dashboard.Interpolate(q.SQL, d.Variables, c.sel, options)
					if err == nil {
						sql, err = dashboard.Expand(sql, r)
					}
					if err != nil {
						t.Fatalf("panel %q: %v", p.Title, err)
					}
					rows := query(t, ctx, db, sql)
					if res, err := testbed.Query(ctx, db.Conn(), sql); err == nil {
						answers[c.name+"/"+p.Title+"/"+q.RefID] = res
					}
					if len(rows) == 0 {
						t.Errorf("panel %q returned no rows:\n%s", p.Title, sql)
						continue
					}
					if p.Type == "timeseries" {
						if _, ok := rows[0][0].(time.Time); !ok {
							t.Errorf("panel %q: first column is %T, a time series needs the time first", p.Title, rows[0][0])
						}
					}
					checkPanel(t, p.Title, c.sel, rows, tr)
				}
			}
		})
	}

	// The same rows on ClickHouse 26.7 (chDB), every panel of every case: the same checks and
	// the same answers as on 18.16.
	t.Run("current", func(t *testing.T) {
		cur := testbed.CurrentClickHouse(t)
		if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
			t.Fatal(err)
		}
		if err := testbed.CopyTables(ctx, db.Conn(), chCfg.DB, cur, "token_rollups", "requests", "gpu_rollups", "alerts", "engine_rollups", "feedback"); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			r.Interval = c.interval
			for _, p := range d.Panels {
				for _, q := range p.Queries {
					sql, err := dashboard.Interpolate(q.SQL, d.Variables, c.sel, options)
					if err == nil {
						sql, err = dashboard.Expand(sql, r)
					}
					if err != nil {
						t.Fatalf("panel %q: %v", p.Title, err)
					}
					res, err := cur.Query(sql, nil)
					if err != nil {
						t.Errorf("%s, panel %q on ClickHouse %s: %v\n%s", c.name, p.Title, cur.Version, err, sql)
						continue
					}
					if len(res.Rows) == 0 {
						t.Errorf("%s, panel %q returned no rows on ClickHouse %s", c.name, p.Title, cur.Version)
						continue
					}
					checkPanel(t, p.Title, c.sel, res.Rows, tr)
					want := answers[c.name+"/"+p.Title+"/"+q.RefID]
					if want == nil {
						continue
					}
					if err := testbed.Compare(want, res, 1e-9, quantileColumns...); err != nil {
						t.Errorf("%s, panel %q: ClickHouse %s answers otherwise than 18.16: %v", c.name, p.Title, cur.Version, err)
					}
				}
			}
		}
	})
}

// quantileColumns are the panels' columns of t-digest quantiles, which current servers read
// off singleton centroids exactly where 18.16 interpolates: checkPanel checks them instead.
var quantileColumns = []string{"ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "tpot_p99", "ttft_ms", "tpot_ms", "ttft_p95_ms"}

// checkPanel checks the values of panels whose answer is known exactly.
func checkPanel(t *testing.T, title string, sel map[string][]string, rows [][]any, tr traffic) {
	t.Helper()
	checkBusiness(t, title, sel, rows)
	all := sel["model"][0] == dashboard.AllValue
	switch title {
	case "Requests":
		if got := rows[0][0]; all && got != uint64(len(tr.requests)) {
			t.Errorf("Requests = %v, want %d", got, len(tr.requests))
		}
	case "Firing alerts":
		if n, ok := rows[0][0].(uint64); !ok || n < 2 {
			t.Errorf("Firing alerts = %v, want the two TTFT SLA alerts at least", rows[0][0])
		}
	case "Alerts firing at the end of the range":
		if len(rows) < 2 {
			t.Errorf("%d firing alerts listed, want the two TTFT SLA alerts at least", len(rows))
		}
	case "Failed requests by code":
		codes := map[string]bool{}
		for _, r := range rows {
			codes[fmt.Sprint(r[0], "/", r[1])] = true
		}
		if all && (!codes["error/500"] || !codes["error/429"] || !codes["timeout/stream_idle"]) {
			t.Errorf("failed requests by code %v, want error/500, error/429 and timeout/stream_idle", codes)
		}
	}
	if title == "Engines over the range" {
		if len(rows) == 0 || len(rows) > 2 {
			t.Errorf("engines over the range: %v, want one row per host", rows)
			return
		}
		for _, r := range rows {
			// 10 of every 40 prefix-cache tokens hit; the surge's queue times lie in (2, 5] s.
			if hit, _ := r[7].(float64); math.Abs(hit-0.25) > 1e-9 {
				t.Errorf("%v: prefix hit rate %v, want 0.25", r[0], r[7])
			}
			if p95, _ := r[10].(float64); p95 < 500 || p95 > 5000 {
				t.Errorf("%v: queue p95 %v ms, want within the buckets", r[0], r[10])
			}
			if mx, _ := r[4].(float64); mx != 30 {
				t.Errorf("%v: queue depth max %v, want the surge's 30", r[0], r[4])
			}
		}
	}
	if title == "TTFT and TPOT P50 / P95 / P99 per bucket (ms)" {
		for _, r := range rows {
			if r[0] == tr.surge.Model && r[1] == tr.surge.Scene && r[2] == surgeBucket(tr) {
				if p99, _ := r[6].(float64); p99 < 6000 {
					t.Errorf("surge series TTFT p99 %v, want above 6000 ms", p99)
				}
				return
			}
		}
		t.Errorf("no row for the surge series in %v", rows)
	}
}

// businessWant is what each business panel answers over addBusiness's conversations and
// verdicts, by row key (its text columns joined by "/") to its number columns; one holds
// for the selection chat, llama-3-70b (conv-1 only), all for every scene and model.
var businessWant = map[string]struct{ all, one map[string][]float64 }{
	// chat's thumbs are up, up (the changed one's last value), down; search's one is on conv-3.
	"Satisfaction: share of thumbs up per scene": {
		all: map[string][]float64{"chat": {2.0 / 3}, "search": {1}},
		one: map[string][]float64{"chat": {1}},
	},
	"Satisfaction by TTFT band (thumbs)": {
		all: map[string][]float64{"1: <= 500 ms": {1, 1, 1}, "2: <= 2 s": {1, 1, 1}, "3: <= 5 s": {1, 0, 0}},
		one: map[string][]float64{"1: <= 500 ms": {1, 1, 1}, "2: <= 2 s": {1, 1, 1}},
	},
	// conversations, completed, abandoned, completion rate
	"Task completion rate per scene": {
		all: map[string][]float64{"chat": {2, 1, 1, 0.5}, "search": {2, 2, 0, 1}},
		one: map[string][]float64{"chat": {1, 1, 0, 1}},
	},
	// conversations, turns p50, p95 (interpolated), mean: chat 3 and 2 turns, search 2 and 4
	"Turns per conversation per scene (P50 / P95)": {
		all: map[string][]float64{"chat": {2, 2.5, 2.95, 2.5}, "search": {2, 3, 3.9, 3}},
		one: map[string][]float64{"chat": {1, 3, 3, 3}},
	},
	// conversations, cost per conversation, rated, satisfied, cost per satisfied conversation:
	// conv-1 costs 0.006 (satisfied), conv-2 0.008 (rated, not satisfied), conv-3 0.004
	// (satisfied), conv-4 0.020 (unrated)
	"Cost per conversation and per satisfied conversation": {
		all: map[string][]float64{"chat": {2, 0.007, 2, 1, 0.014}, "search": {2, 0.012, 1, 1, 0.004}},
		one: map[string][]float64{"chat": {1, 0.006, 1, 1, 0.006}},
	},
	// scores, p10, p50, p90, mean
	"Quality score percentiles per model x scene": {
		all: map[string][]float64{"chat/llama-3-70b": {2, 0.54, 0.7, 0.86, 0.7}, "chat/qwen2.5-72b": {1, 0.4, 0.4, 0.4, 0.4},
			"search/llama-3-70b": {1, 0.7, 0.7, 0.7, 0.7}, "search/qwen2.5-72b": {2, 0.62, 0.7, 0.78, 0.7}},
		one: map[string][]float64{"chat/llama-3-70b": {2, 0.54, 0.7, 0.86, 0.7}},
	},
}

// checkBusiness compares a business panel's rows with businessWant: the same keys, each
// with its numbers. A time series' time column is skipped; it must hold one point per
// series, the conversations lying within one minute.
func checkBusiness(t *testing.T, title string, sel map[string][]string, rows [][]any) {
	t.Helper()
	w, ok := businessWant[title]
	if !ok {
		return
	}
	want := w.one
	if sel["model"][0] == dashboard.AllValue {
		want = w.all
	}
	got := map[string][]float64{}
	for _, r := range rows {
		var key []string
		var nums []float64
		for _, v := range r {
			switch v := v.(type) {
			case time.Time:
			case string:
				key = append(key, v)
			default:
				f, err := toFloat(v)
				if err != nil {
					t.Errorf("%s: %v in %v", title, err, r)
				}
				nums = append(nums, f)
			}
		}
		k := strings.Join(key, "/")
		if _, dup := got[k]; dup {
			t.Errorf("%s: two rows for %s: %v", title, k, rows)
		}
		got[k] = nums
	}
	if len(got) != len(want) {
		t.Errorf("%s: rows %v, want %v", title, got, want)
	}
	for k, wn := range want {
		gn, ok := got[k]
		if !ok || len(gn) != len(wn) {
			t.Errorf("%s, %s: %v, want %v", title, k, gn, wn)
			continue
		}
		for i := range wn {
			if math.Abs(gn[i]-wn[i]) > 1e-9 {
				t.Errorf("%s, %s: %v, want %v", title, k, gn, wn)
				break
			}
		}
	}
}

func toFloat(v any) (float64, error) {
	switch v := v.(type) {
	case float64:
		return v, nil
	case float32:
		return float64(v), nil
	case uint64:
		return float64(v), nil
	case uint32:
		return float64(v), nil
	case uint8:
		return float64(v), nil
	case int64:
		return float64(v), nil
	case json.Number:
		return v.Float64()
	case *float64: // a Nullable column's
		if v == nil {
			return 0, errors.New("NULL is not a number")
		}
		return *v, nil
	}
	return 0, fmt.Errorf("%T is not a number", v)
}

func surgeBucket(tr traffic) string {
	b := events.DefaultBucketBounds()
	return b.Label(b.Index(tr.surge.InputTokens))
}

// query runs sql and returns its rows, each value scanned into its column's Go type.
func query(t *testing.T, ctx context.Context, db *chdb.DB, sql string) [][]any {
	t.Helper()
	rows, err := db.Conn().Query(ctx, sql)
	if err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	var out [][]any
	for rows.Next() {
		ptrs := make([]any, len(types))
		for i, ct := range types {
			ptrs[i] = reflect.New(ct.ScanType()).Interface()
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
		row := make([]any, len(ptrs))
		for i, p := range ptrs {
			row[i] = reflect.ValueOf(p).Elem().Interface()
		}
		out = append(out, row)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	return out
}
