package scrape

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// vllmExposition writes a vLLM v1 exposition of one model on three engine cores with the
// bucket layouts vLLM uses, and the _created series beside each counter, which gpuwatch
// does not read, as a real server has. It returns the text and its number of series
// (sample lines).
func vllmExposition(cores int, step int) (string, int) {
	var b strings.Builder
	series := 0
	lbl := func(core int) string { return fmt.Sprintf(`engine="%d",model_name="%s"`, core, llama) }
	gauge := func(name string, v func(int) float64) {
		fmt.Fprintf(&b, "# HELP %s gauge\n# TYPE %s gauge\n", name, name)
		for c := range cores {
			fmt.Fprintf(&b, "%s{%s} %g\n", name, lbl(c), v(c))
			series++
		}
	}
	ctr := func(name string, per float64) {
		fmt.Fprintf(&b, "# HELP %s_total counter\n# TYPE %s_total counter\n", name, name)
		for c := range cores {
			fmt.Fprintf(&b, "%s_total{%s} %g\n", name, lbl(c), per*float64(step+1)*float64(c+1))
			series++
		}
		fmt.Fprintf(&b, "# HELP %s_created created\n# TYPE %s_created gauge\n", name, name)
		for c := range cores {
			fmt.Fprintf(&b, "%s_created{%s} 1.7645e+09\n", name, lbl(c))
			series++
		}
	}
	hist := func(name string, le []float64) {
		fmt.Fprintf(&b, "# HELP %s histogram\n# TYPE %s histogram\n", name, name)
		for c := range cores {
			n := float64((step + 1) * (c + 1))
			for i, u := range le {
				fmt.Fprintf(&b, "%s_bucket{engine=\"%d\",le=\"%g\",model_name=\"%s\"} %g\n", name, c, u, llama, n*float64(i+1))
				series++
			}
			total := n * float64(len(le)+1)
			fmt.Fprintf(&b, "%s_bucket{engine=\"%d\",le=\"+Inf\",model_name=\"%s\"} %g\n", name, c, llama, total)
			fmt.Fprintf(&b, "%s_count{%s} %g\n%s_sum{%s} %g\n", name, lbl(c), total, name, lbl(c), total*0.5)
			series += 3
		}
	}
	lat := []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60}
	ttft := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	gauge("vllm:num_requests_running", func(c int) float64 { return float64(4 + c) })
	gauge("vllm:num_requests_waiting", func(c int) float64 { return float64(c) })
	gauge("vllm:kv_cache_usage_perc", func(c int) float64 { return 0.1 * float64(c+1) })
	for _, name := range []string{"vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:generation_tokens"} {
		ctr(name, 100)
	}
	hist("vllm:request_queue_time_seconds", lat)
	hist("vllm:time_to_first_token_seconds", ttft)
	hist("vllm:request_prefill_time_seconds", lat)
	hist("vllm:request_decode_time_seconds", lat)
	hist("vllm:iteration_tokens_total", []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048})
	return b.String(), series
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// childEnv makes the test binary, started again, run TestBenchServers: the engine and the
// nats-server the benchmark talks to, in a process of their own, so that the benchmark's
// process CPU is gpuwatch's side alone.
const childEnv = "TOKENSCOPE_SCRAPE_BENCH_SERVERS"

// TestBenchServers is not a test: started by benchServers in a child process, it serves the
// benchmark's expositions (the next of them at each request, counters moving) and, when
// asked, a JetStream nats-server, prints their URLs and runs until its stdin closes.
func TestBenchServers(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("started by BenchmarkScrapeVLLM300 only")
	}
	bodies, _ := vllmBodies()
	zipped := make([][]byte, len(bodies))
	for i, body := range bodies {
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		_, _ = io.WriteString(zw, body)
		_ = zw.Close()
		zipped[i] = z.Bytes()
	}
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := (n.Add(1) - 1) % int64(len(bodies))
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		// As Python's prometheus_client (vLLM's and SGLang's exporter) does, gzip when the
		// client accepts it (compressed beforehand: the engine's cost is not measured here).
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			_, _ = w.Write(zipped[i])
			return
		}
		_, _ = io.WriteString(w, bodies[i])
	}))
	defer srv.Close()
	natsURL := "-"
	if mode == "nats" {
		natsURL = testbed.NATS(t).ClientURL()
	}
	fmt.Printf("servers %s %s\n", srv.URL, natsURL)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// servers is the child process of TestBenchServers.
type servers struct {
	cmd         *exec.Cmd
	engine, nat string
}

func benchServers(b *testing.B, mode string) *servers {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchServers$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("cannot start the servers' process: %v", err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	var s servers
	s.cmd = cmd
	if _, err := fmt.Fscanf(bufio.NewReader(stdout), "servers %s %s\n", &s.engine, &s.nat); err != nil {
		b.Fatalf("cannot read the servers' URLs: %v", err)
	}
	return &s
}

// cpu is the child's CPU so far, from /proc; 0 where there is none.
func (s *servers) cpu() time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64) // utime and stime, fields 14 and 15
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func vllmBodies() ([]string, int) {
	bodies := make([]string, 16)
	var series int
	for i := range bodies {
		bodies[i], series = vllmExposition(3, i)
	}
	return bodies, series
}

// BenchmarkScrapeVLLM300 scrapes, parses and publishes a vLLM exposition of about 300
// series from an HTTP endpoint on loopback, counters moving at each scrape. "nop" stops at
// the publisher's queue; "nats" publishes through bus.Publisher to JetStream and waits until
// every sample is acknowledged. The engine and the nats-server run in a child process:
// cpu-ns/scrape is this process's CPU, gpuwatch's side alone (HTTP client, parse, samples,
// encoding, publishing client); servers-cpu-ns/scrape is the child's, at /proc's 10 ms
// resolution, for reference.
func BenchmarkScrapeVLLM300(b *testing.B) {
	bodies, series := vllmBodies()
	run := func(b *testing.B, srv *servers, pub publisher, wait func()) {
		s, _ := newScraper(b, []Target{{Engine: "vllm", Name: "vllm", URL: srv.engine}}, pub, 16)
		s.opts.Timeout = 5 * time.Second
		now := t0
		s.Tick(context.Background(), now)
		b.ReportAllocs()
		b.ResetTimer()
		cpu0, child0, n := cpuTime(), srv.cpu(), 0
		for b.Loop() {
			n++
			now = now.Add(time.Second)
			s.Tick(context.Background(), now)
		}
		wait()
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/scrape")
		b.ReportMetric(float64((srv.cpu()-child0).Nanoseconds())/float64(n), "servers-cpu-ns/scrape")
		b.ReportMetric(float64(series), "series")
		b.ReportMetric(float64(len(bodies[0])), "bytes")
	}
	// parse is the parser alone on the same text (textparse, keeping the families read):
	// the share of the scrape it takes; expfmt is the parser it replaced, for comparison,
	// and floor is textparse going through every series and keeping nothing.
	cpuPer := func(b *testing.B, f func()) {
		b.ReportAllocs()
		cpu0, n := cpuTime(), 0
		for b.Loop() {
			f()
			n++
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/op")
	}
	b.Run("parse", func(b *testing.B) {
		body := []byte(bodies[0])
		c := newSeriesCache(0)
		cpuPer(b, func() {
			if _, err := families(body, names["vllm"], c); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("expfmt", func(b *testing.B) {
		p := expfmt.NewTextParser(model.UTF8Validation)
		cpuPer(b, func() {
			if _, err := p.TextToMetricFamilies(strings.NewReader(bodies[0])); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("floor", func(b *testing.B) {
		body := []byte(bodies[0])
		cpuPer(b, func() {
			p := textparse.NewPromParser(body, labels.NewSymbolTable(), false)
			for {
				e, err := p.Next()
				if err != nil {
					break
				}
				if e == textparse.EntrySeries {
					p.Series()
				}
			}
		})
	})
	b.Run("nop", func(b *testing.B) { run(b, benchServers(b, "http"), nopPublisher{}, func() {}) })
	b.Run("nats", func(b *testing.B) {
		srv := benchServers(b, "nats")
		nc, err := nats.Connect(srv.nat)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: -1, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamEngine); err != nil {
			b.Fatal(err)
		}
		pub := bus.NewPublisher(js, bus.PublisherOptions{Buffer: 1 << 20, FlushTimeout: 10 * time.Second}, nil, discard())
		done := make(chan error, 1)
		go func() { done <- pub.Run(ctx) }()
		run(b, srv, pub, func() {
			for pub.Buffered() > 0 {
				time.Sleep(100 * time.Microsecond)
			}
		})
		cancel()
		<-done
	})
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, string, []byte) bool { return true }

// floodBody is a vLLM exposition of one model with n tenant series of one counter
// before the model's own series; tick changes the tenants when rotate is set.
func floodBody(n, tick int, rotate bool) []byte {
	var b strings.Builder
	b.WriteString("# TYPE vllm:prompt_tokens_total counter\n")
	for i := range n {
		t := i
		if rotate {
			t = tick*n + i
		}
		fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\",tenant=\"t%d\"} %d\n", t, tick)
	}
	fmt.Fprintf(&b, "vllm:prompt_tokens_total{model_name=\"m\"} %d\n", tick)
	b.WriteString("# TYPE vllm:time_to_first_token_seconds histogram\n")
	for _, le := range []string{"0.1", "1", "+Inf"} {
		fmt.Fprintf(&b, "vllm:time_to_first_token_seconds_bucket{le=%q,model_name=\"m\"} %d\n", le, tick)
	}
	b.WriteString("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n")
	return []byte(b.String())
}

// BenchmarkFlood100k: the parse of an exposition with 100,000 series of one family (5 times
// the default limit) before the model's own, the same series at every scrape or new ones
// at every scrape: what the limit's bookkeeping costs where it is busiest.
func BenchmarkFlood100k(b *testing.B) {
	for _, rotate := range []bool{false, true} {
		b.Run(fmt.Sprintf("rotate=%v", rotate), func(b *testing.B) {
			bodies := [][]byte{floodBody(100_000, 0, rotate), floodBody(100_000, 1, rotate), floodBody(100_000, 2, rotate)}
			c := newSeriesCache(0)
			for _, body := range bodies {
				if _, err := families(body, names["vllm"], c); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := families(bodies[i%3], names["vllm"], c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
