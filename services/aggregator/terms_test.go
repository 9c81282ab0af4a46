package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cuttableRelay forwards TCP connections to target until cut: then it resets every
// connection it holds and refuses new ones until restored (NATS away for a while).
type cuttableRelay struct {
	relayConns
	ln     net.Listener
	cutOff bool
}

func startCuttableRelay(t testing.TB, target string) *cuttableRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cuttableRelay{relayConns: relayConns{target: target, conns: map[net.Conn]struct{}{}}, ln: ln}
	go r.accept()
	t.Cleanup(func() {
		ln.Close()
		r.cut()
	})
	return r
}

func (r *cuttableRelay) url() string { return "nats://" + r.ln.Addr().String() }

func (r *cuttableRelay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		off := r.cutOff
		r.mu.Unlock()
		if off {
			c.Close()
			continue
		}
		r.forward(c)
	}
}

func (r *cuttableRelay) cut() {
	r.mu.Lock()
	r.cutOff = true
	conns := r.heldLocked()
	r.mu.Unlock()
	for _, c := range conns {
		r.drop(c)
	}
}

func (r *cuttableRelay) restore() {
	r.mu.Lock()
	r.cutOff = false
	r.mu.Unlock()
}

// runLeasedThrough runs the aggregator with vars, its NATS through relay and its HTTP on a
// free address, and waits until it holds the lease. It returns that address, what stops the
// run (the end of the test does too) and where run's error comes.
func runLeasedThrough(t *testing.T, relay *cuttableRelay, vars envVars) (addr string, cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	addr = freeAddr(t)
	vars["NATS_URL"], vars["HTTP_ADDR"] = relay.url(), addr
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, vars.get, testWriter{t}) }()
	waitFor(t, 30*time.Second, "the aggregator holds the lease", func() bool { return gauge(addr, "aggregator_lease_held") == 1 })
	return addr, cancel, errc
}

// TestLeaseTakenBackTermAfterTerm cuts the only aggregator off NATS past its fence four
// times: each time it stops counting and takes its lease back, without exiting, panicking
// on its metrics or staying unready, and without keeping what the lost term ran (goroutines,
// connections). Every event is counted once.
func TestLeaseTakenBackTermAfterTerm(t *testing.T) {
	b := newBed(t)
	relay := startCuttableRelay(t, strings.TrimPrefix(b.natsURL, "nats://"))
	const ttl = 2 * time.Second
	// Every pipeline: each term makes them all again.
	addr, cancel, done := runLeasedThrough(t, relay, leaseVars(b, envVars{"AGG_LEASE_TTL": ttl.String(), "AGG_GPU": "true", "AGG_ENGINE": "true", "AGG_FEEDBACK": "true"}))

	var total uint64
	publish := func(n int) {
		t.Helper()
		b.publish(t, spreadEvents(n, time.Now().UTC()))
		total += uint64(n)
		b.waitRows(t, time.Minute, total, "SELECT count() FROM requests")
		b.waitRows(t, time.Minute, total, "SELECT sum(requests) FROM token_rollups")
	}
	publish(500)
	var counts []int
	for term := range 4 {
		relay.cut()
		waitFor(t, 3*ttl, "the cut-off aggregator stops counting", func() bool { return gauge(addr, "aggregator_lease_held") == 0 })
		relay.restore()
		waitFor(t, 6*ttl, "the aggregator takes its lease back", func() bool { return gauge(addr, "aggregator_lease_held") == 1 })
		select {
		case err := <-done:
			t.Fatalf("term %d: the aggregator stopped with %v", term+2, err)
		default:
		}
		publish(500)
		if code, body := readyz(addr); code != http.StatusOK {
			t.Fatalf("term %d: /readyz = %d %s", term+2, code, body)
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(metrics), "aggregator_published_total") {
			t.Fatalf("term %d: /metrics = %d:\n%s", term+2, resp.StatusCode, metrics)
		}
		counts = append(counts, clientGoroutines())
	}
	t.Logf("goroutines after each term taken back: %v", counts)
	if grown := counts[3] - counts[1]; grown > 4 {
		var sb strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&sb, 1)
		t.Errorf("%d goroutines more after two more terms (%v):\n%s", grown, counts, sb.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the aggregator stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the aggregator did not stop")
	}
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != total {
		t.Fatalf("sum(requests) = %d, want %d", got, total)
	}
	if got := b.scalar(t, "SELECT count() FROM requests"); got != total {
		t.Fatalf("count() FROM requests = %d, want %d", got, total)
	}
	checkRollupsPublished(t, b, "agg-l", total)
}

// clientGoroutines counts the goroutines of this process other than the in-process
// nats-server's (which keeps each term's ephemeral consumer until its inactivity threshold).
func clientGoroutines() int {
	var sb strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&sb, 2)
	n := 0
	for _, g := range strings.Split(sb.String(), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "nats-io/nats-server") {
			n++
		}
	}
	return n
}

// metric reads one sample of /metrics by its name and labels as written there
// (`aggregator_open_windows{stream="tokens"}`); -1 when absent.
func metric(addr, series string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == series {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return -1
}

// TestStandingByHoldsNothing cuts the aggregator off NATS while its windows are open: once it
// stops counting and stands by, its gauges say it holds nothing (the windows were dropped),
// as a process waiting for the lease; frozen at the lost term's values they would count
// twice with the holder's, or keep a stall alert firing.
func TestStandingByHoldsNothing(t *testing.T) {
	b := newBed(t)
	relay := startCuttableRelay(t, strings.TrimPrefix(b.natsURL, "nats://"))
	const ttl = 2 * time.Second
	addr, cancel, done := runLeasedThrough(t, relay, leaseVars(b, envVars{"AGG_LEASE_TTL": ttl.String(), "AGG_LATENESS": "30s"}))
	b.publish(t, spreadEvents(500, time.Now().UTC()))
	b.waitRows(t, time.Minute, 500, "SELECT count() FROM requests")
	waitFor(t, 10*time.Second, "the windows are open", func() bool {
		return metric(addr, `aggregator_open_windows{stream="tokens"}`) > 0 && metric(addr, `aggregator_active_keys{stream="tokens"}`) > 0
	})
	relay.cut()
	waitFor(t, 3*ttl, "the cut-off aggregator stops counting", func() bool { return gauge(addr, "aggregator_lease_held") == 0 })
	time.Sleep(time.Second) // the lost term has stopped
	for _, name := range []string{"open_windows", "active_keys", "buffered", "paused", "write_stalled_seconds", "publish_stalled_seconds", "watermark_held"} {
		if v := metric(addr, `aggregator_`+name+`{stream="tokens"}`); v != 0 {
			t.Errorf("aggregator_%s{stream=\"tokens\"} = %v while standing by, want 0", name, v)
		}
	}
	// Once the lost term has ended, its publisher, outbox sweeper and watermarks are gone, as
	// in a process that never held the lease: a watermark frozen at the lost term's would age
	// and fire an alert.
	waitFor(t, 30*time.Second, "the lost term's watermark leaves /metrics", func() bool {
		return metric(addr, "aggregator_watermark_published_timestamp_seconds") == -1
	})
	if v := gauge(addr, "aggregator_lease_held"); v != 0 {
		t.Fatalf("aggregator_lease_held = %v with NATS cut off, want 0", v)
	}
	for _, series := range []string{"aggregator_watermarks_published_total", "aggregator_published_total"} {
		if v := metric(addr, series); v != -1 {
			t.Errorf("%s = %v while standing by, want no series", series, v)
		}
	}
	relay.restore()
	waitFor(t, 6*ttl, "the aggregator takes its lease back", func() bool { return gauge(addr, "aggregator_lease_held") == 1 })
	waitFor(t, 10*time.Second, "the windows are open again", func() bool { return metric(addr, `aggregator_open_windows{stream="tokens"}`) > 0 })
	if v := metric(addr, "aggregator_watermark_published_timestamp_seconds"); v == -1 {
		t.Error("aggregator_watermark_published_timestamp_seconds has no series once the lease is held again")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
