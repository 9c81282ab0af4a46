package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func getenvFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// start runs gpuwatch with env until the test ends.
func start(t *testing.T, env map[string]string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, getenvFrom(env), io.Discard) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return errors.New("run did not return 30s after its context ended")
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fetchAll returns every sample in the GPU_SAMPLES stream with its Nats-Msg-Id.
func fetchAll(t *testing.T, js jetstream.JetStream) ([]events.GPUSample, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, events.StreamGPU, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(ctx, events.StreamGPU)
	if err != nil {
		t.Fatal(err)
	}
	n := int(info.CachedInfo().State.Msgs)
	var samples []events.GPUSample
	var ids []string
	for len(samples) < n {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("after %d of %d messages: %v", len(samples), n, err)
		}
		var s events.GPUSample
		if err := events.UnmarshalGPUSample(msg.Data(), &s); err != nil {
			t.Fatal(err)
		}
		if err := s.ValidateAt(time.Now()); err != nil {
			t.Fatalf("published sample breaks the contract: %v: %s", err, msg.Data())
		}
		samples = append(samples, s)
		ids = append(ids, msg.Headers().Get(jetstream.MsgIDHeader))
	}
	return samples, ids
}

func streamMsgs(t *testing.T, js jetstream.JetStream) int {
	st, err := js.Stream(context.Background(), events.StreamGPU)
	if err != nil {
		return 0
	}
	return int(st.CachedInfo().State.Msgs)
}

func TestRunSyntheticEndToEnd(t *testing.T) {
	ns := testbed.NATS(t)
	addr := freeAddr(t)
	stop := start(t, map[string]string{
		"NATS_URL":                ns.ClientURL(),
		"HTTP_ADDR":               addr,
		"GPUWATCH_SOURCE":         "synthetic",
		"GPUWATCH_SYNTHETIC_GPUS": "3",
		"GPUWATCH_INTERVAL":       "100ms",
		"GPUWATCH_HOST":           "gpu-node.3",
	})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	eventually(t, "9 samples in GPU_SAMPLES", func() bool { return streamMsgs(t, js) >= 9 })
	eventually(t, "/readyz 200", func() bool { code, _ := get(t, "http://"+addr+"/readyz"); return code == 200 })
	code, body := get(t, "http://"+addr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	for _, want := range []string{
		`DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-node.3",UUID="GPU-`,
		`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{`,
		`gpuwatch_ticks_total `,
		`gpuwatch_published_total `,
		`gpuwatch_publish_dropped_total 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	samples, ids := fetchAll(t, js)
	seen := map[string]bool{}
	counter := map[string]float64{} // per GPU: the previous sample's energy_j
	for i, s := range samples {
		if s.Host != "gpu-node.3" || s.Source != events.SourceSynthetic || s.UtilGPUPct == nil || s.EnergyJ == nil {
			t.Fatalf("sample %d: %+v", i, s)
		}
		// energy_used_j is the counter's delta since the GPU's previous sample; none on its first.
		prev, ok := counter[s.GPUUUID]
		switch {
		case !ok && s.EnergyUsedJ != nil:
			t.Fatalf("sample %d, the first of %s, has energy_used_j %v", i, s.GPUUUID, *s.EnergyUsedJ)
		case ok && (s.EnergyUsedJ == nil || math.Abs(*s.EnergyUsedJ-(*s.EnergyJ-prev)) > 1e-6):
			t.Fatalf("sample %d of %s: energy_used_j %v, want %v", i, s.GPUUUID, s.EnergyUsedJ, *s.EnergyJ-prev)
		}
		counter[s.GPUUUID] = *s.EnergyJ
		if want := fmt.Sprintf("gpu-node.3/%s/%s", s.GPUUUID, events.FormatTS(s.TS)); ids[i] != want {
			t.Fatalf("Nats-Msg-Id %q, want %q", ids[i], want)
		}
		if seen[ids[i]] {
			t.Fatalf("two messages with id %s", ids[i])
		}
		seen[ids[i]] = true
	}
}

// TestRunBuffersWhileNATSIsAway stops NATS for a while: the samples of the ticks in
// between are published once it is back.
func TestRunBuffersWhileNATSIsAway(t *testing.T) {
	dir := t.TempDir()
	port := 0
	{
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	ns := testbed.StartNATS(t, dir, port)
	addr := freeAddr(t)
	stop := start(t, map[string]string{
		"NATS_URL":                ns.ClientURL(),
		"HTTP_ADDR":               addr,
		"GPUWATCH_SOURCE":         "synthetic",
		"GPUWATCH_SYNTHETIC_GPUS": "1",
		"GPUWATCH_INTERVAL":       "100ms",
		"GPUWATCH_HOST":           "h",
	})
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	eventually(t, "first samples", func() bool { return streamMsgs(t, js) >= 2 })

	ns.Shutdown()
	ns.WaitForShutdown()
	away := time.Now()
	eventually(t, "/readyz says NATS is away", func() bool {
		code, body := get(t, "http://"+addr+"/readyz")
		return code == 503 && strings.Contains(body, "not connected to NATS")
	})
	time.Sleep(500 * time.Millisecond)
	back := time.Now()
	testbed.StartNATS(t, dir, port)
	eventually(t, "samples after NATS is back", func() bool {
		return streamMsgs(t, js) > 0 && lastTS(t, js).After(back)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	samples, _ := fetchAll(t, js)
	during := 0
	for _, s := range samples {
		if s.TS.After(away) && s.TS.Before(back) {
			during++
		}
	}
	if during < 3 {
		t.Fatalf("%d samples from the %s NATS was away, want at least 3", during, back.Sub(away).Round(time.Millisecond))
	}
}

func lastTS(t *testing.T, js jetstream.JetStream) time.Time {
	st, err := js.Stream(context.Background(), events.StreamGPU)
	if err != nil {
		return time.Time{}
	}
	m, err := st.GetLastMsgForSubject(context.Background(), events.SubjectGPUSamplesAll)
	if err != nil {
		return time.Time{}
	}
	var s events.GPUSample
	if events.UnmarshalGPUSample(m.Data, &s) != nil {
		return time.Time{}
	}
	return s.TS
}

func TestRunStartErrors(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"no NVML", map[string]string{"GPUWATCH_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"},
			"NVML library not found: /nonexistent/libnvidia-ml.so.1"},
		{"bad interval", map[string]string{"GPUWATCH_INTERVAL": "0s"}, "GPUWATCH_INTERVAL=0s"},
		{"unparsable interval", map[string]string{"GPUWATCH_INTERVAL": "soon"}, "GPUWATCH_INTERVAL"},
		{"bad source", map[string]string{"GPUWATCH_SOURCE": "dcgm"}, `GPUWATCH_SOURCE="dcgm"`},
		{"replay without file", map[string]string{"GPUWATCH_SOURCE": "replay"}, "GPUWATCH_REPLAY_FILE is empty"},
		{"replay file missing", map[string]string{"GPUWATCH_SOURCE": "replay", "GPUWATCH_REPLAY_FILE": "/nonexistent.jsonl"},
			"GPUWATCH_REPLAY_FILE=/nonexistent.jsonl cannot be read"},
		{"PCIe too often", map[string]string{"GPUWATCH_PCIE_INTERVAL": "10ms"}, "GPUWATCH_PCIE_INTERVAL=10ms"},
		{"tiny publish bytes", map[string]string{"GPUWATCH_PUBLISH_BUFFER_BYTES": "1000"}, "GPUWATCH_PUBLISH_BUFFER_BYTES=1000"},
		{"bad log level", map[string]string{"GPUWATCH_LOG_LEVEL": "loud"}, "GPUWATCH_LOG_LEVEL"},
		{"bad engine", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINES": "ollama=http://127.0.0.1:1/metrics"}, "GPUWATCH_ENGINES"},
		{"engine timeout above interval", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_TIMEOUT": "2s"},
			"GPUWATCH_ENGINE_TIMEOUT=2s must be positive and below GPUWATCH_INTERVAL=1s"},
		{"engine body limit", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_MAX_BYTES": "10"}, "GPUWATCH_ENGINE_MAX_BYTES=10"},
		{"engine models", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_MAX_MODELS": "0"}, "GPUWATCH_ENGINE_MAX_MODELS=0"},
		{"engine series", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_MAX_SERIES": "999"}, "GPUWATCH_ENGINE_MAX_SERIES=999 must be 1000 to 1000000"},
		{"engine series above the bound", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_MAX_SERIES": "2000000"}, "GPUWATCH_ENGINE_MAX_SERIES=2000000"},
		{"engine series below the models", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_MAX_MODELS": "1024", "GPUWATCH_ENGINE_MAX_SERIES": "20000"},
			"GPUWATCH_ENGINE_MAX_SERIES=20000 cannot hold the GPUWATCH_ENGINE_MAX_MODELS=1024 models"},
		{"bad NATS URL", map[string]string{"GPUWATCH_SOURCE": "synthetic", "NATS_URL": "::"}, "NATS_URL"},
		{"no NATS", map[string]string{"GPUWATCH_SOURCE": "synthetic", "NATS_URL": "nats://127.0.0.1:1", "HTTP_ADDR": "127.0.0.1:0"},
			"cannot connect to NATS"},
		{"bad HTTP_ADDR", map[string]string{"GPUWATCH_SOURCE": "synthetic", "HTTP_ADDR": "256.0.0.1:1"}, "HTTP_ADDR"},
		{"no proc", map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_PROC_ROOT": "/nonexistent/proc"},
			"GPUWATCH_PROC_ROOT=/nonexistent/proc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), getenvFrom(tt.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

func TestHostDefaultsToHostname(t *testing.T) {
	cfg, err := parseConfig(getenvFrom(nil), func() (string, error) { return "node-7", nil })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "node-7" || cfg.Interval != time.Second || cfg.HTTPAddr != "127.0.0.1:9102" || cfg.Source != "nvml" {
		t.Fatalf("defaults: %+v", cfg)
	}
	_, err = parseConfig(getenvFrom(nil), func() (string, error) { return "", errors.New("no uts") })
	if err == nil || !strings.Contains(err.Error(), "GPUWATCH_HOST") {
		t.Fatalf("hostname failure: %v", err)
	}
}

// TestRunScrapesEngines runs gpuwatch against a vLLM-style endpoint and one that is down:
// engine samples land on engine.sample.<host> in ENGINE_SAMPLES beside the GPU samples,
// on the same ticks.
func TestRunScrapesEngines(t *testing.T) {
	ns := testbed.NATS(t)
	var prompt atomic.Int64
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m.1\"} 5\n"+
			"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\",model_name=\"m.1\"} %d\n", prompt.Add(100))
	}))
	defer vllm.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	addr := freeAddr(t)
	stop := start(t, map[string]string{
		"NATS_URL":                ns.ClientURL(),
		"HTTP_ADDR":               addr,
		"GPUWATCH_SOURCE":         "synthetic",
		"GPUWATCH_SYNTHETIC_GPUS": "1",
		"GPUWATCH_INTERVAL":       "250ms",
		"GPUWATCH_HOST":           "gpu-node.3",
		"GPUWATCH_ENGINES":        "vllm=" + vllm.URL + "/metrics,sglang:gone=" + gone.URL + "/metrics",
	})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	engineMsgs := func() int {
		st, err := js.Stream(context.Background(), events.StreamEngine)
		if err != nil {
			return 0
		}
		return int(st.CachedInfo().State.Msgs)
	}
	eventually(t, "10 engine samples", func() bool { return engineMsgs() >= 10 })
	_, body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{`gpuwatch_engine_up{engine="vllm"} 1`, `gpuwatch_engine_up{engine="gone"} 0`,
		`gpuwatch_engine_scrape_errors_total{engine="gone",reason="connect"}`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	gpuTS := map[time.Time]bool{}
	gpus, _ := fetchAll(t, js)
	for _, s := range gpus {
		gpuTS[s.TS] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, events.StreamEngine, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var up, down, deltas, sameTick int
	for range engineMsgs() {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if msg.Subject() != "engine.sample.gpu-node_3" {
			t.Fatalf("subject %q", msg.Subject())
		}
		var s events.EngineSample
		if err := events.UnmarshalEngineSample(msg.Data(), &s); err != nil {
			t.Fatal(err)
		}
		if err := s.ValidateAt(time.Now()); err != nil {
			t.Fatalf("%v: %s", err, msg.Data())
		}
		if gpuTS[s.TS] {
			sameTick++
		}
		switch {
		case s.Name == "vllm" && s.Up && s.Model == "m.1" && s.Waiting != nil && *s.Waiting == 5:
			up++
			if s.PromptTokens != nil {
				// 100 a scrape; a scrape that timed out on a loaded machine was still
				// answered, so the next delta spans two.
				if d := *s.PromptTokens; d <= 0 || math.Mod(d, 100) != 0 {
					t.Errorf("prompt_tokens delta %v, want a multiple of 100", d)
				}
				deltas++
			}
		case s.Name == "vllm" && !s.Up && s.Error == "timeout":
			// The scrape's limit is 80 % of the interval; a loaded machine may miss it.
		case s.Name == "gone" && !s.Up && s.Error == "connect" && s.Engine == events.EngineSGLang:
			down++
		default:
			t.Fatalf("unexpected sample %s", msg.Data())
		}
	}
	if up == 0 || down == 0 || deltas == 0 {
		t.Fatalf("up %d, down %d, with deltas %d", up, down, deltas)
	}
	if sameTick < up+down-2 {
		t.Errorf("%d of %d engine samples share a tick with GPU samples", sameTick, up+down)
	}
}

// TestRunPublishesHostSamples runs gpuwatch on a fixture /proc and /sys: every tick's host
// sample reaches HOST_SAMPLES with the ts of that tick's GPU samples, memory from the
// fixture's meminfo, and rates from the second tick on.
func TestRunPublishesHostSamples(t *testing.T) {
	ns := testbed.NATS(t)
	stop := start(t, map[string]string{
		"NATS_URL": ns.ClientURL(), "HTTP_ADDR": freeAddr(t),
		"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_SYNTHETIC_GPUS": "2", "GPUWATCH_INTERVAL": "100ms",
		"GPUWATCH_HOST":      "gpu-node-3",
		"GPUWATCH_PROC_ROOT": "internal/hostsource/testdata/host/proc",
		"GPUWATCH_SYS_ROOT":  "internal/hostsource/testdata/host/sys",
	})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	hostMsgs := func() int {
		st, err := js.Stream(context.Background(), events.StreamHost)
		if err != nil {
			return 0
		}
		return int(st.CachedInfo().State.Msgs)
	}
	eventually(t, "3 host samples in HOST_SAMPLES", func() bool { return hostMsgs() >= 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	gpuTicks := map[time.Time]bool{}
	gpus, _ := fetchAll(t, js)
	for _, s := range gpus {
		gpuTicks[s.TS] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, events.StreamHost, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	n := hostMsgs()
	for i := range n {
		msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var s events.HostSample
		if err := events.UnmarshalHostSample(msg.Data(), &s); err != nil {
			t.Fatal(err)
		}
		if err := s.ValidateAt(time.Now()); err != nil {
			t.Fatalf("%v: %s", err, msg.Data())
		}
		if msg.Subject() != "host.sample.gpu-node-3" || !gpuTicks[s.TS] {
			t.Fatalf("subject %s, ts %s not a GPU tick", msg.Subject(), s.TS)
		}
		if s.MemTotalBytes == nil || *s.MemTotalBytes != 2113451096*1024 {
			t.Fatalf("sample %d: %s", i, msg.Data())
		}
		if i > 0 && (s.NetRxBps == nil || *s.NetRxBps != 0 || s.DiskWriteBps == nil || s.DeltaSeconds == nil) {
			t.Fatalf("sample %d has no rates: %s", i, msg.Data())
		}
	}
}

// TestBadHostRefused: a GPUWATCH_HOST every sample would be refused with (not UTF-8: the
// contract refuses the host, so gpuwatch would run publishing nothing), or that cannot be
// the emitter's instance (spaces around it, control characters) stops gpuwatch at start.
func TestBadHostRefused(t *testing.T) {
	for _, host := range []string{"gpu\xff01", " gpu01", "gpu01\n", "gpu\x0001", "gpu\t01"} {
		_, err := parseConfig(getenvFrom(map[string]string{"GPUWATCH_HOST": host}), func() (string, error) { return "node-7", nil })
		if err == nil || !strings.Contains(err.Error(), "GPUWATCH_HOST") {
			t.Errorf("GPUWATCH_HOST=%q: err = %v, want one naming GPUWATCH_HOST", host, err)
		}
	}
	// what the emitter's instance label holds: a proxy's upstream host:port (IPv6 in
	// brackets), an OTLP resource's host.name, a unicode hostname
	for _, host := range []string{"gpu-node-3", "gpu-node.3", "gpu_01.rack-2.example.com", "gpu-node-3:8000",
		"10.0.0.7:8000", "[::1]:8000", "[2001:db8::7]:30000", "gpü-01.例え.jp", "ip-10-0-0-7.ec2.internal"} {
		if _, err := parseConfig(getenvFrom(map[string]string{"GPUWATCH_HOST": host}), func() (string, error) { return "node-7", nil }); err != nil {
			t.Errorf("GPUWATCH_HOST=%q: %v", host, err)
		}
	}
}

// TestEngineMaxSeries: the limit on an engine's series is a setting, 20000 by default or
// 150 a model where GPUWATCH_ENGINE_MAX_MODELS asks for more (so that raising the models
// alone still starts), and a limit on models as high as 1024 is accepted with a limit on
// series that can hold them.
func TestEngineMaxSeries(t *testing.T) {
	host := func() (string, error) { return "node-7", nil }
	cfg, err := parseConfig(getenvFrom(map[string]string{"GPUWATCH_SOURCE": "synthetic"}), host)
	if err != nil || cfg.EngineMaxSeries != 20000 {
		t.Fatalf("default: GPUWATCH_ENGINE_MAX_SERIES=%d, err %v; want 20000", cfg.EngineMaxSeries, err)
	}
	cfg, err = parseConfig(getenvFrom(map[string]string{"GPUWATCH_SOURCE": "synthetic",
		"GPUWATCH_ENGINE_MAX_MODELS": "1024", "GPUWATCH_ENGINE_MAX_SERIES": "153600"}), host)
	if err != nil || cfg.EngineMaxSeries != 153600 {
		t.Fatalf("GPUWATCH_ENGINE_MAX_SERIES=%d, err %v; want 153600", cfg.EngineMaxSeries, err)
	}
	cfg, err = parseConfig(getenvFrom(map[string]string{"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_ENGINE_MAX_MODELS": "200"}), host)
	if err != nil || cfg.EngineMaxSeries != 30000 {
		t.Fatalf("GPUWATCH_ENGINE_MAX_MODELS=200 alone: GPUWATCH_ENGINE_MAX_SERIES=%d, err %v; want 30000", cfg.EngineMaxSeries, err)
	}
}
