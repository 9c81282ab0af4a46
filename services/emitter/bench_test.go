package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	_ "net/http/pprof" // the OpenStreams child serves profiles on EMITTER_TEST_PPROF
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// TestMain lets a benchmark start this test binary as the emitter in its own process, so
// that the proxy's memory can be measured apart from the client's and the fake LLM's.
func TestMain(m *testing.M) {
	if mode := os.Getenv("EMITTER_TEST_CHILD"); mode != "" {
		if addr := os.Getenv("EMITTER_TEST_PPROF"); addr != "" {
			// Profiles of the child, fetched by the benchmarks under BENCH_PROFILE_DIR, and
			// /debug/settle for OpenStreams: the garbage collected and the memory it held
			// returned to the OS.
			http.HandleFunc("/debug/settle", func(http.ResponseWriter, *http.Request) {
				runtime.GC()
				debug.FreeOSMemory()
			})
			go func() { _ = http.ListenAndServe(addr, nil) }()
		}
		serve := func() error { return run(context.Background(), nil, os.Environ(), os.Stdout, os.Stderr) }
		switch mode {
		case "bare":
			serve = serveBare
		case "floor":
			serve = serveRelayFloor
		case "floor-http":
			serve = serveRelayFloorHTTP
		case "revproxy", "nethttp":
			serve = func() error { return serveNetHTTPFloor(mode) }
		case "nats":
			serve = serveNATS
		}
		if err := serve(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serveBare serves, on the emitter's HTTP server (pkg/ops) and HTTP_ADDR, a handler that only
// holds streams: it reads the request, sends the headers and one event, and waits for the
// client to leave. Its memory per stream is net/http's own, the floor under the proxy's.
func serveBare() error {
	srv := ops.NewServer(os.Getenv("HTTP_ADDR"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	streams := prometheus.NewGauge(prometheus.GaugeOpts{Name: "emitter_proxy_inflight_streams", Help: "Streams held."})
	srv.Registry().MustRegister(streams)
	srv.Handle("POST /v1/chat/completions", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		streams.Inc()
		defer streams.Dec()
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	return srv.Run(context.Background(), time.Second)
}

// serveNATS runs a nats-server with JetStream on NATS_PORT, storing in NATS_STORE, until it is
// killed: the peer benchmarks measure its CPU time apart from the load generator's.
func serveNATS() error {
	port, err := strconv.Atoi(os.Getenv("NATS_PORT"))
	if err != nil {
		return fmt.Errorf("cannot read NATS_PORT: %w", err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true,
		StoreDir: os.Getenv("NATS_STORE"), NoLog: true, NoSigs: true, MaxPayload: 8 << 20})
	if err != nil {
		return fmt.Errorf("cannot create nats-server: %w", err)
	}
	s.Start()
	s.WaitForShutdown()
	return nil
}

// timing is one streamed request seen from the client.
type timing struct{ ttft, total time.Duration }

// The client's read buffers and meters, reused: the load generator shares the cores with
// what it measures.
var (
	clientBufs   = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}
	clientMeters = sync.Pool{New: func() any { return &meter.Meter{} }}
)

func streamOnce(client *http.Client, url, body string) (timing, error) {
	start := time.Now()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return timing{}, err
	}
	defer resp.Body.Close()
	m := clientMeters.Get().(*meter.Meter)
	defer clientMeters.Put(m)
	m.Reset(meter.OpenAIChat, true, start)
	bp := clientBufs.Get().(*[]byte)
	defer clientBufs.Put(bp)
	for {
		n, err := resp.Body.Read(*bp)
		if n > 0 {
			m.Feed((*bp)[:n], time.Now(), nil)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return timing{}, err
		}
	}
	r := m.Result(time.Now())
	if st, code := r.Status(true); st != events.StatusOK {
		return timing{}, fmt.Errorf("status %s %s", st, code)
	}
	return timing{r.TTFT, r.Total}, nil
}

func pct(v []time.Duration, p float64) time.Duration {
	slices.Sort(v)
	return v[min(int(p*float64(len(v))), len(v)-1)]
}

// benchFloor is set while BenchmarkProxyAddedLatency measures the relay floor, not the emitter.
var benchFloor bool

// child is an emitter serving in its own process: this test binary started again.
type child struct {
	base string
	pid  int
	cmd  *exec.Cmd
}

// startChild starts the emitter in its own process against the fake at upstream, publishing
// to the NATS at natsURL. It also serves profiles and /debug/settle, on pprofAddr.
func startChild(b *testing.B, natsURL, upstream string, env ...string) (c *child, pprofAddr string) {
	return startChildAs(b, "serve", natsURL, upstream, env...)
}

// startChildAs starts this test binary in the child mode given (TestMain): serve, bare or floor.
func startChildAs(b *testing.B, mode, natsURL, upstream string, env ...string) (c *child, pprofAddr string) {
	return startChildFrom(b, os.Args[0], mode, natsURL, upstream, env...)
}

// startChildFrom is startChildAs with the test binary bin, such as one built from another
// checkout of the emitter.
func startChildFrom(b *testing.B, bin, mode, natsURL, upstream string, env ...string) (c *child, pprofAddr string) {
	addr := freeAddr(b)
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), "EMITTER_TEST_CHILD="+mode, "HTTP_ADDR="+addr, "NATS_URL="+natsURL,
		"EMITTER_UPSTREAM_URL="+upstream, "LOG_LEVEL=error", "EMITTER_SHUTDOWN_GRACE=1s",
		"EMITTER_OTLP_HTTP_ADDR=off", "EMITTER_OTLP_GRPC_ADDR=off")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	pprofAddr = freeAddr(b)
	cmd.Env = append(cmd.Env, "EMITTER_TEST_PPROF="+pprofAddr)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c = &child{base: "http://" + addr, pid: cmd.Process.Pid, cmd: cmd}
	if mode == "serve" || mode == "bare" {
		waitReady(b, c.base)
	} else {
		waitListening(b, addr) // the floors relay /readyz too
	}
	return c, pprofAddr
}

// cpuTime is the CPU time, user and system, a process has used so far.
func cpuTime(b *testing.B, pid int) time.Duration {
	d, ok := testbed.ProcessCPU(pid)
	if !ok {
		b.Skip("no /proc: the figure needs Linux")
	}
	return d
}

// BenchmarkProxyAddedLatency runs streaming requests through the proxy and, side by side, as
// many straight to the fake LLM, and reports the difference of the client-seen TTFT and total
// percentiles, and the proxy's CPU time per request. Each iteration starts one request of
// each; the rate is per path. The emitter runs in its own process (its garbage collector and
// scheduler do not stop the client's or the fake's clock, and its CPU time is its own); the
// client, the fake LLM and NATS share this one, and all share the machine. On Linux the client
// and the fake LLM are the epoll load generator of loadgen_linux_test.go (the fake sends
// fakellm's bytes at the same pace); BENCH_HARNESS=nethttp uses net/http's client and
// fakellm's server instead, which cost more CPU per request than the proxy measured.
// BENCH_PROXY_INPROC=1 runs the emitter in this process instead, as a library, with net/http's
// harness; BENCH_RATES=1000,500,250 sets the rates; BENCH_EMITTER_ENV="GOMAXPROCS=1 …" adds to
// the emitter's environment. Run it with -benchtime=3000x.
func BenchmarkProxyAddedLatency(b *testing.B) {
	opts := fakellm.Options{TTFT: 20 * time.Millisecond, TPOT: 2 * time.Millisecond, Tokens: 20}
	if v := os.Getenv("BENCH_TOKENS"); v != "" { // tokens per stream: 1 leaves the per-request cost
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_TOKENS=%q: want a count of tokens", v)
		}
		opts.Tokens = n
	}
	var base, direct, pprofAddr string
	pid := 0
	inproc := os.Getenv("BENCH_PROXY_INPROC") == "1"
	epoll := haveEpollHarness && !inproc && os.Getenv("BENCH_HARNESS") != "nethttp"
	if inproc {
		var stop func()
		base, _, stop = serveRigWith(b, opts)
		defer stop()
		direct = fakeUpstream(b, base)
	} else {
		ns := testbed.NATS(b)
		upstream := ""
		if epoll {
			upstream = "http://" + startEpollFake(b, opts.TTFT, opts.TPOT, opts.Tokens).addr
		} else {
			fake := httptest.NewServer(fakellm.New(opts))
			defer fake.Close()
			upstream = fake.URL
		}
		mode := "serve"
		if m := os.Getenv("BENCH_PROXY"); m == "floor" || m == "floor-http" {
			if !epoll {
				b.Skip("BENCH_PROXY=" + m + " needs the epoll load generator")
			}
			mode, benchFloor = m, true
			defer func() { benchFloor = false }()
		}
		var c *child
		c, pprofAddr = startChildAs(b, mode, ns.ClientURL(), upstream, strings.Fields(os.Getenv("BENCH_EMITTER_ENV"))...)
		base, direct, pid = c.base, upstream, c.pid
	}
	rates := []int{1000, 250}
	if v := os.Getenv("BENCH_RATES"); v != "" { // such as 1000,500,250
		rates = rates[:0]
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || r <= 0 {
				b.Fatalf("BENCH_RATES=%q: %q is not a rate", v, f)
			}
			rates = append(rates, r)
		}
	}
	for _, rate := range rates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			var prof sync.WaitGroup
			if pprofAddr != "" && os.Getenv("BENCH_PROFILE_DIR") != "" {
				// The emitter's CPU profile of two seconds under load.
				prof.Go(func() {
					path := filepath.Join(os.Getenv("BENCH_PROFILE_DIR"), fmt.Sprintf("cpu-rate%d.pb.gz", rate))
					if err := fetch("http://"+pprofAddr+"/debug/pprof/profile?seconds=2", path); err != nil {
						b.Error(err)
					}
				})
			}
			if epoll {
				epollAddedLatency(b, base, direct, pid, time.Second/time.Duration(rate))
			} else {
				addedLatency(b, base, direct, pid, time.Second/time.Duration(rate))
			}
			prof.Wait()
			if pprofAddr != "" && os.Getenv("BENCH_PROFILE_DIR") != "" {
				path := filepath.Join(os.Getenv("BENCH_PROFILE_DIR"), fmt.Sprintf("allocs-rate%d.pb.gz", rate))
				if err := fetch("http://"+pprofAddr+"/debug/pprof/allocs", path); err != nil {
					b.Error(err)
				}
			}
		})
	}
}

func addedLatency(b *testing.B, base, direct string, pid int, every time.Duration) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2000, DisableCompression: true}}
	defer client.CloseIdleConnections()
	body := `{"model":"gpt-4o","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"measure the proxy"}]}`
	// Warm up: connections in both pools, the proxy's to the fake included.
	var warm sync.WaitGroup
	for range 100 {
		for _, u := range []string{base, direct} {
			warm.Go(func() {
				if _, err := streamOnce(client, u+"/v1/chat/completions", body); err != nil {
					b.Error(err)
				}
			})
		}
	}
	warm.Wait()
	var mu sync.Mutex
	var viaT, dirT []timing
	var failures int
	var wg sync.WaitGroup
	one := func(url string, into *[]timing) {
		defer wg.Done()
		t, err := streamOnce(client, url, body)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failures++
			return
		}
		*into = append(*into, t)
	}
	var cpu0 time.Duration
	var mem0 map[string]float64
	if pid != 0 {
		cpu0, mem0 = cpuTime(b, pid), childMemory(b, base, pid)
	}
	self0 := cpuTime(b, os.Getpid())
	tick := time.NewTicker(every)
	defer tick.Stop()
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		wg.Add(2)
		go one(base+"/v1/chat/completions", &viaT)
		go one(direct+"/v1/chat/completions", &dirT)
		<-tick.C
	}
	sent := time.Since(start)
	wg.Wait()
	self := cpuTime(b, os.Getpid()) - self0
	if failures > 0 || len(viaT) == 0 {
		b.Fatalf("%d requests failed", failures)
	}
	reportAdded(b, viaT, dirT, sent, self, base, pid, cpu0, mem0)
}

// reportAdded reports the added latency of the proxy (through minus direct, per percentile),
// the rate kept, and the CPU time of the harness and of the emitter per request.
func reportAdded(b *testing.B, viaT, dirT []timing, sent, self time.Duration, base string, pid int, cpu0 time.Duration, mem0 map[string]float64) {
	split := func(ts []timing) (ttft, total []time.Duration) {
		for _, t := range ts {
			ttft, total = append(ttft, t.ttft), append(total, t.total)
		}
		return
	}
	vt, vtot := split(viaT)
	dt, dtot := split(dirT)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(pct(vt, .5)-pct(dt, .5)), "added-ttft-p50-ms")
	b.ReportMetric(ms(pct(vt, .99)-pct(dt, .99)), "added-ttft-p99-ms")
	b.ReportMetric(ms(pct(vtot, .5)-pct(dtot, .5)), "added-total-p50-ms")
	b.ReportMetric(ms(pct(vtot, .99)-pct(dtot, .99)), "added-total-p99-ms")
	b.ReportMetric(ms(pct(dt, .99)), "direct-ttft-p99-ms")
	// The rate the loop kept up (it falls behind when the machine is saturated), and the CPU
	// time this process (client, fake LLM, NATS; and the emitter when in-process) spent per
	// pair of requests: with the emitter's, what the load costs the two cores.
	b.ReportMetric(float64(len(viaT))/sent.Seconds(), "req/s")
	b.ReportMetric(float64(self.Microseconds())/float64(len(viaT)), "harness-cpu-us/pair")
	if pid != 0 {
		b.ReportMetric(float64((cpuTime(b, pid)-cpu0).Microseconds())/float64(len(viaT)), "proxy-cpu-us/req")
		if mem0 == nil {
			return // the relay floor serves no metrics
		}
		const allocs = "go_memstats_alloc_bytes_total"
		b.ReportMetric((childMemory(b, base, pid)[allocs]-mem0[allocs])/float64(len(viaT))/1024, "proxy-alloc-KB/req")
	}
}

// BenchmarkOpenStreams holds 5,000 streams open through an emitter running in its own process
// and reports its memory per stream: Go heap and stacks in use, and resident set size. The
// client and the fake LLM run in this process, so none of their memory is counted; what is
// counted is the difference the streams make, measured after 50 streams opened and closed.
// The sub-benchmark bare holds as many streams on the same HTTP server with a handler that
// does nothing else: the part of the figure that is net/http's, not the proxy's.
//
// The streams are opened all at once (BENCH_OPEN_WAVE=n: n at a time), and measured once the
// proxy has taken every one off net/http (emitter_proxy_parked_streams). The settled-
// figures are measured after that, once the emitter collected its garbage and returned the
// memory it held to the OS (/debug/settle): what the held streams occupy, without what
// opening 5,000 connections at once left behind. BENCH_OPEN_HOLD=2m30s holds them that much
// longer first, with nothing forced, and reports held- figures. Run it with -benchtime=1x.
func BenchmarkOpenStreams(b *testing.B) {
	for _, mode := range []string{"proxy", "bare"} {
		b.Run(mode, func(b *testing.B) { openStreams(b, mode) })
	}
}

func openStreams(b *testing.B, mode string) {
	const streams = 5000
	ns := testbed.NATS(b)
	// The first token comes at once, the next only after an hour: every stream stays open.
	fake := httptest.NewServer(fakellm.New(fakellm.Options{TPOT: time.Hour, Tokens: 2}))
	b.Cleanup(fake.Close) // after the streams are released, even when the benchmark fails
	env := []string{"EMITTER_STREAM_IDLE_TIMEOUT=1h"}
	if mode == "bare" {
		env = append(env, "EMITTER_TEST_CHILD=bare")
	}
	c, pprofAddr := startChild(b, ns.ClientURL(), fake.URL, env...)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}}
	body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold on"}]}`
	// Warm up: connection pools, buffers and the first event.
	holdStreams(b, client, c.base, body, 50)()
	settle(b, pprofAddr)
	before := childMemory(b, c.base, c.pid)
	wave := streams
	if v := os.Getenv("BENCH_OPEN_WAVE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || streams%n != 0 {
			b.Fatalf("BENCH_OPEN_WAVE=%q: want a divisor of %d", v, streams)
		}
		wave = n
	}
	var releases []func()
	for range streams / wave {
		releases = append(releases, holdStreams(b, client, c.base, body, wave))
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			for _, r := range releases {
				r()
			}
		})
	}
	b.Cleanup(release)
	time.Sleep(time.Second)
	// Silent streams leave net/http after half a second (internal/proxy, detach.go); with
	// 5,000 to take over on a busy machine, it can take a little longer.
	waitMetric(b, c.base, "emitter_proxy_parked_streams", streams, 30*time.Second)
	after := childMemory(b, c.base, c.pid)
	if after["emitter_proxy_inflight_streams"] != streams {
		b.Fatalf("inflight_streams = %v, want %d", after["emitter_proxy_inflight_streams"], streams)
	}
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		for name, path := range map[string]string{"heap.pb.gz": "heap?gc=1", "goroutine.txt": "goroutine?debug=1"} {
			if err := fetch("http://"+pprofAddr+"/debug/pprof/"+path, filepath.Join(dir, mode+"-"+name)); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
	}
	goMem := (after["go_memstats_heap_inuse_bytes"] + after["go_memstats_stack_inuse_bytes"]) -
		(before["go_memstats_heap_inuse_bytes"] + before["go_memstats_stack_inuse_bytes"])
	b.ReportMetric(goMem/streams/1024, "go-KB/stream")
	b.ReportMetric((after["go_memstats_stack_inuse_bytes"]-before["go_memstats_stack_inuse_bytes"])/streams/1024, "stack-KB/stream")
	b.ReportMetric(float64(after["go_goroutines"]-before["go_goroutines"])/streams, "goroutines/stream")
	b.ReportMetric((after["rss"]-before["rss"])/streams/1024, "rss-KB/stream")
	b.ReportMetric(streams, "streams")
	if v := os.Getenv("BENCH_OPEN_HOLD"); v != "" {
		// Hold the streams longer, with nothing forced: the runtime's own collection (at
		// least every two minutes) and scavenger run as in a service.
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("BENCH_OPEN_HOLD=%q: %v", v, err)
		}
		time.Sleep(d)
		held := childMemory(b, c.base, c.pid)
		b.ReportMetric(((held["go_memstats_heap_inuse_bytes"]+held["go_memstats_stack_inuse_bytes"])-
			(before["go_memstats_heap_inuse_bytes"]+before["go_memstats_stack_inuse_bytes"]))/streams/1024, "held-go-KB/stream")
		b.ReportMetric((held["rss"]-before["rss"])/streams/1024, "held-rss-KB/stream")
	}
	settle(b, pprofAddr)
	settled := childMemory(b, c.base, c.pid)
	b.ReportMetric(((settled["go_memstats_heap_inuse_bytes"]+settled["go_memstats_stack_inuse_bytes"])-
		(before["go_memstats_heap_inuse_bytes"]+before["go_memstats_stack_inuse_bytes"]))/streams/1024, "settled-go-KB/stream")
	b.ReportMetric((settled["rss"]-before["rss"])/streams/1024, "settled-rss-KB/stream")
	release()
}

// settle has the child collect its garbage and return the memory it held to the OS.
func settle(b testing.TB, pprofAddr string) {
	resp, err := http.Get("http://" + pprofAddr + "/debug/settle")
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
}

// waitMetric waits until the child's metric reaches want; a metric the child does not have
// (the bare server, an emitter before detached streams) is not waited for.
func waitMetric(b testing.TB, base, name string, want float64, limit time.Duration) {
	for deadline := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		m := childMemory(b, base, 0)
		v, ok := m[name]
		if !ok || v >= want {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s = %v after %s, want %v (emitter_proxy_detached_streams %v, go_goroutines %v)",
				name, v, limit, want, m["emitter_proxy_detached_streams"], m["go_goroutines"])
		}
	}
}

// fetch writes what url answers to path.
func fetch(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

func waitReady(b testing.TB, base string) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("emitter not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdStreams opens n streams, waits for each one's first bytes, and returns a function that
// closes them all.
func holdStreams(b testing.TB, client *http.Client, base, body string, n int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var opened, done sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		opened.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				errs <- err
				opened.Done()
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 1024)
			_, err = resp.Body.Read(buf)
			if err != nil {
				errs <- err
			}
			opened.Done()
			<-ctx.Done()
		}()
	}
	all := make(chan struct{})
	go func() { opened.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Minute):
		cancel()
		b.Fatalf("cannot open the streams: not all %d got their first bytes within a minute", n)
	}
	select {
	case err := <-errs:
		cancel()
		b.Fatalf("cannot open the streams: %v", err)
	default:
	}
	return func() { cancel(); done.Wait() }
}

// childMemory reads the child's Go memory metrics from /metrics and its resident set size.
func childMemory(b testing.TB, base string, pid int) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			out[name] = f
		}
	}
	if rss, ok := processRSS(pid); ok {
		out["rss"] = rss
	}
	return out
}

// processRSS reads the resident set size of process pid, in bytes, from /proc.
func processRSS(pid int) (float64, bool) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil || pid == 0 {
		return 0, false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb * 1024, err == nil
		}
	}
	return 0, false
}

// BenchmarkIngestNATS posts NDJSON batches of 1,000 events to POST /v1/events from two
// clients in parallel and counts the events per second until all of them are stored in
// LLM_EVENTS by the real NATS (file storage, duplicate window, Nats-Msg-Id = event id).
// The bodies are made before the clock starts; client, emitter and nats-server share the
// process and the machine's cores. cpu-µs/event is the CPU time of all three per event: it
// moves much less than events/s when other processes load the machine. The clients wait
// for each answer, given once the batch is stored (the default), or with BENCH_ACK=buffered
// once the publisher holds it. Run it with -benchtime=200x.
func BenchmarkIngestNATS(b *testing.B) {
	base, js, stop := serveRig(b, "EMITTER_PUBLISH_BUFFER=1000000", "EMITTER_PUBLISH_BUFFER_BYTES=1073741824")
	defer stop()
	const batch = 1000
	ts := time.Now().UTC().Format(events.TimeLayout)
	bodies := make([]string, b.N)
	for k := range bodies {
		var sb strings.Builder
		sb.Grow(batch * 240)
		for i := range batch {
			fmt.Fprintf(&sb, `{"v":1,"event_id":"b%d-%d","ts":%q,"model":"llama-3-70b","scene":"chat","env":"prod","input_tokens":1024,"output_tokens":128,"ttft_ms":210.5,"total_ms":3300.25,"status":"ok","stream":true}`+"\n", k, i, ts)
		}
		bodies[k] = sb.String()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	ackMode := os.Getenv("BENCH_ACK") // X-Tokenscope-Ack: "" (stored, the default) or buffered
	var next atomic.Int64
	var retries atomic.Int64
	b.SetParallelism(2) // four clients with GOMAXPROCS 2
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), selfCPU()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := bodies[next.Add(1)-1]
			// A 503, or a 2xx with items dropped, means the publish buffer is full: back off
			// and send the batch again, as a client would; JetStream drops what got through twice.
			for {
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/events", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/x-ndjson")
				if ackMode != "" {
					req.Header.Set("X-Tokenscope-Ack", ackMode)
				}
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				var a struct{ Rejected int }
				_ = json.NewDecoder(resp.Body).Decode(&a)
				resp.Body.Close()
				ok := resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted
				if ok && a.Rejected == 0 {
					break
				}
				if !ok && resp.StatusCode != 503 {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				retries.Add(1)
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	n := int(next.Load())
	waitMsgs(b, js, uint64(n*batch))
	b.ReportMetric(float64(n*batch)/time.Since(start).Seconds(), "events/s")
	b.ReportMetric(float64((selfCPU()-cpu0).Microseconds())/float64(n*batch), "cpu-µs/event")
	b.ReportMetric(float64(retries.Load()), "retried-batches")
}

// selfCPU is the CPU time, user and system, this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// waitListening waits until addr takes connections.
func waitListening(b testing.TB, addr string) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%s does not take connections: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
