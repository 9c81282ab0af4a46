package main

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// buildAggregator builds the aggregator beside this module, to run it as a process that a
// test can pause.
func buildAggregator(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "aggregator")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "aggregator")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build the aggregator: %v\n%s", err, out)
	}
	return bin
}

func startAggregatorProcess(t *testing.T, bin string, env map[string]string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	log, err := os.Create(filepath.Join(t.TempDir(), "aggregator.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		_ = log.Close()
	})
	return cmd
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// metric reads one sample from a Prometheus text exposition, such as
// alerter_rollups_skipped_total{reason="late"}; -1 when it is not there.
func metric(t *testing.T, addr, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", sample, err)
			}
			return f
		}
	}
	return -1
}

// traffic publishes request events of both partitions (env prod and staging) as they
// happen, until stop is closed.
func traffic(t *testing.T, js jetstream.JetStream, stop <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for _, env := range []string{"prod", "staging"} {
				ev := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: time.Now().UTC().Add(-150 * time.Millisecond).Truncate(time.Millisecond),
					Model: "m", Scene: "chat", Env: env, InputTokens: 100, OutputTokens: 20, TTFTMs: 30, TotalMs: 100, Status: events.StatusOK}
				m := nats.NewMsg(events.RequestSubject(env, "chat"))
				m.Data = events.AppendRequest(nil, &ev)
				m.Header.Set(jetstream.MsgIDHeader, ev.EventID)
				if _, err := js.PublishMsg(context.Background(), m); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		}
	}()
}

// TestLaggingPartition runs two partitioned aggregators (prod and staging) as processes and
// the alerter, with request events flowing. Paused for 2 s, the staging aggregator writes its
// windows late; the alerter waits for its watermark and evaluates those windows with both
// partitions' rollups: none is late. Paused past ALERTER_WATERMARK_TIMEOUT, it makes a
// window time out, which is counted; once it is back, it is waited for again. With the
// settle time alone (before watermarks) the 2 s pause made its rollups late.
func TestLaggingPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the aggregator")
	}
	bin := buildAggregator(t)
	b := newDeliveryBed(t)
	aggEnv := func(consumer, filter string) map[string]string {
		return map[string]string{
			"NATS_URL": b.environ["NATS_URL"], "CLICKHOUSE_ADDR": b.environ["CLICKHOUSE_ADDR"], "CLICKHOUSE_DB": b.environ["CLICKHOUSE_DB"],
			"CLICKHOUSE_USER": b.environ["CLICKHOUSE_USER"], "CLICKHOUSE_PASSWORD": b.environ["CLICKHOUSE_PASSWORD"],
			"HTTP_ADDR": "127.0.0.1:0", "AGG_CONSUMER": consumer, "AGG_FILTER": filter, "AGG_GPU": "false", "AGG_STORE_REQUESTS": "false",
			"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "info",
			// The pauses are the lag under test: one past two thirds of the lease's TTL would
			// make the aggregator stop counting and exit, as a holder that cannot renew.
			"AGG_LEASE_TTL": "10m",
		}
	}
	startAggregatorProcess(t, bin, aggEnv("agg-prod", "llm.req.prod.>"))
	staging := startAggregatorProcess(t, bin, aggEnv("agg-staging", "llm.req.staging.>"))
	const timeout = 6 * time.Second
	addr := freeAddr(t)
	a := startAlerter(t, b.with("HTTP_ADDR", addr, "ALERTER_SETTLE", "300ms", "ALERTER_WATERMARK_TIMEOUT", timeout.String()))
	defer a.stop(t)
	waitFor(t, "the alerter's metrics", 30*time.Second, func() bool { return metric(t, addr, "alerter_windows_evaluated_total") >= 0 })

	stop := make(chan struct{})
	var wg sync.WaitGroup
	traffic(t, b.js, stop, &wg)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	waitFor(t, "both aggregators' watermarks", time.Minute, func() bool { return metric(t, addr, "alerter_aggregators") == 2 })
	waitFor(t, "windows evaluated", time.Minute, func() bool { return metric(t, addr, "alerter_windows_evaluated_total") >= 2 })

	// A short lag: the windows wait, and none of the staging partition's rollups is late.
	if err := staging.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := staging.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	before := metric(t, addr, "alerter_windows_evaluated_total")
	waitFor(t, "windows evaluated after the lag", time.Minute, func() bool {
		return metric(t, addr, "alerter_windows_evaluated_total") >= before+3
	})
	if late := metric(t, addr, `alerter_rollups_skipped_total{reason="late"}`); late != 0 {
		t.Fatalf("%v rollups late after a 2 s lag of one partition: its windows were evaluated without it", late)
	}
	if n := metric(t, addr, "alerter_watermark_timeouts_total"); n != 0 {
		t.Fatalf("%v watermark timeouts after a lag shorter than the timeout", n)
	}

	// A lag past the timeout: a window goes on without the partition, counted.
	if err := staging.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a watermark timeout", timeout+30*time.Second, func() bool { return metric(t, addr, "alerter_watermark_timeouts_total") == 1 })
	if n := metric(t, addr, "alerter_aggregators_lagging"); n != 1 {
		t.Errorf("aggregators_lagging = %v, want 1", n)
	}
	if err := staging.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the staging aggregator waited for again", time.Minute, func() bool { return metric(t, addr, "alerter_aggregators_lagging") == 0 })
	close(stop)
	wg.Wait()
	if n := metric(t, addr, "alerter_watermark_timeouts_total"); n != 1 {
		t.Errorf("watermark_timeouts_total = %v, want 1: one lag, logged and counted once", n)
	}
}
