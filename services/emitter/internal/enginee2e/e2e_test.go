package enginee2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// rootDir finds the checkout: the folder above holding services/gpuwatch.
func rootDir(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "services", "gpuwatch", "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("cannot find the checkout's services/ above the test")
		}
		dir = parent
	}
}

// build compiles the service in services/<name> into dir.
func build(t *testing.T, root, dir, name string, cgo bool) string {
	t.Helper()
	bin := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(root, "services", name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if cgo {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-Wno-deprecated-declarations")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build %s: %v\n%s", name, err, out)
	}
	return bin
}

// start runs bin with exactly vars (and PATH) until the test ends, its output in a log that
// a failing test prints.
func start(t *testing.T, bin string, vars map[string]string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logPath := filepath.Join(t.TempDir(), filepath.Base(bin)+".log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		log.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s log (tail):\n%s", filepath.Base(bin), tail(string(b), 3000))
			}
		}
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// nearestRank is the exact q-quantile of sorted values.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// bucketWidth is the width of the histogram bucket holding v (0 to the first bound for the
// lowest; the +Inf bucket has no width: +Inf).
func bucketWidth(le []float64, v float64) float64 {
	lo := 0.0
	for _, b := range le {
		if v <= b {
			return b - lo
		}
		lo = b
	}
	return math.Inf(1)
}

// TestEngineQueueThroughPipeline is the engine layer end to end, with the real NATS and
// ClickHouse: the fake engine (fakellm's scheduler: 4 running slots) gets far more requests
// than it can run, so a queue builds; the real gpuwatch binary scrapes its vLLM /metrics and
// publishes engine samples; the real aggregator binary windows them into engine_rollups.
// The rows must show the queue, account for every request the engine finished (queue-time
// observations, prompt and generated tokens exactly), and the queue-time p95 read off the
// rollups' merged buckets must lie within the histogram's bucket resolution of the p95 of
// the queue times the fake measured exactly.
func TestEngineQueueThroughPipeline(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gpuwatch and the aggregator and runs them for ~20 s")
	}
	ns := testbed.NATS(t)
	chCfg := testbed.ClickHouse(t)
	root := rootDir(t)
	bins := t.TempDir()
	gpuwatch := build(t, root, bins, "gpuwatch", true)
	aggregator := build(t, root, bins, "aggregator", false)

	const model = "qwen2.5-7b-instruct"
	fake := fakellm.New(fakellm.Options{TTFT: 30 * time.Millisecond, TPOT: 5 * time.Millisecond, Tokens: 20, MaxBatch: 4, ModelName: model})
	srv := httptest.NewServer(fake)
	defer srv.Close()

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	samples, err := nc.SubscribeSync("engine.sample.e2e-host")
	if err != nil {
		t.Fatal(err)
	}
	start(t, aggregator, map[string]string{"NATS_URL": ns.ClientURL(), "CLICKHOUSE_ADDR": chCfg.Addr, "CLICKHOUSE_HTTP_ADDR": chCfg.HTTPAddr,
		"CLICKHOUSE_DB": chCfg.DB, "CLICKHOUSE_USER": chCfg.User, "CLICKHOUSE_PASSWORD": chCfg.Password, "HTTP_ADDR": "127.0.0.1:0",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "200ms", "AGG_LOG_LEVEL": "warn"})
	start(t, gpuwatch, map[string]string{"NATS_URL": ns.ClientURL(), "HTTP_ADDR": "127.0.0.1:0", "GPUWATCH_HOST": "e2e-host",
		"GPUWATCH_SOURCE": "synthetic", "GPUWATCH_SYNTHETIC_GPUS": "1", "GPUWATCH_INTERVAL": "250ms",
		"GPUWATCH_ENGINES": "vllm=" + srv.URL + "/metrics", "GPUWATCH_LOG_LEVEL": "warn"})

	// The load may only start once gpuwatch has scraped the idle engine: the first scrape
	// has no deltas, so what the engine did before it would not be in any sample.
	for {
		m, err := samples.NextMsg(60 * time.Second)
		if err != nil {
			t.Fatalf("no engine sample from gpuwatch: %v", err)
		}
		var s events.EngineSample
		if err := events.UnmarshalEngineSample(m.Data, &s); err != nil {
			t.Fatal(err)
		}
		if s.Up && s.Model == model {
			break
		}
	}
	_ = samples.Unsubscribe()

	// 64 requests at once on 4 slots of ~130 ms each: 16 waves, queue times up to ~2 s.
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"question %d: how long is the queue"}]}`, model, i)
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("status %d, %v", resp.StatusCode, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request failed: %v", err)
	}
	recs := fake.Finished()
	if len(recs) != n {
		t.Fatalf("the fake finished %d requests, want %d", len(recs), n)
	}
	var queue []float64
	var prompt, generated float64
	for _, r := range recs {
		queue = append(queue, r.Queue.Seconds())
		prompt += float64(r.Input)
		generated += float64(r.Output)
	}
	slices.Sort(queue)

	db, err := chdb.Open(context.Background(), chCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const where = "host = 'e2e-host' AND engine = 'vllm' AND model = '" + model + "'"
	var observed float64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := db.Conn().QueryRow(context.Background(), "SELECT sum(queue_time_count) FROM engine_rollups WHERE "+where).Scan(&observed)
		if err == nil && observed == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine_rollups hold %v queue-time observations after 60 s, want %d (%v)", observed, n, err)
		}
	}
	var (
		le, counts              []float64
		gotPrompt, gotGenerated float64
		queueMax, runningMax    float64
		down                    uint64
		rows                    uint64
	)
	if err := db.Conn().QueryRow(context.Background(), `SELECT any(queue_time_le), sumForEach(queue_time_counts), sum(prompt_tokens), sum(generation_tokens),
		max(queue_depth_max), max(running_max), sum(down_samples), count()
		FROM engine_rollups WHERE `+where+` AND length(queue_time_le) > 0`).Scan(&le, &counts, &gotPrompt, &gotGenerated, &queueMax, &runningMax, &down, &rows); err != nil {
		t.Fatal(err)
	}
	if gotPrompt != prompt || gotGenerated != generated {
		t.Errorf("engine_rollups: %v prompt and %v generated tokens, the fake processed %v and %v", gotPrompt, gotGenerated, prompt, generated)
	}
	// The queue is visible: at the first scrapes of the load, most of the 64 were waiting.
	if queueMax < 20 || runningMax != 4 || down != 0 {
		t.Errorf("queue depth max %v, running max %v, %d down samples: want a queue of 20 or more behind 4 running, none down", queueMax, runningMax, down)
	}
	est := events.HistogramQuantile(0.95, le, counts)
	exact := nearestRank(queue, 0.95)
	width := bucketWidth(le, exact)
	t.Logf("%d rows; queue time p95 from the rollups' buckets %.3f s, exact %.3f s (bucket width %.2f s); max queue depth %v", rows, est, exact, width, queueMax)
	if exact < le[0] {
		t.Fatalf("exact queue p95 %.3f s is below the first bucket bound %.2f s: the load built no queue worth the name", exact, le[0])
	}
	if math.Abs(est-exact) > width {
		t.Errorf("queue time p95 %.3f s from the rollups, exact %.3f s: further apart than the bucket width %.2f s", est, exact, width)
	}
}
