package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/lease"
)

// gauge reads an unlabelled metric from /metrics; -1 when the server does not answer or
// has no such metric.
func gauge(addr, name string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	return -1
}

// waitFor polls cond every 50 ms and returns when it first held, failing after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
	}
}

// readyz returns /readyz's status and body.
func readyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// leaseHolder returns the process that holds consumer's lease, zero when none does (released).
func leaseHolder(t testing.TB, js jetstream.JetStream, consumer string) lease.Holder {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), lease.Bucket)
	if err != nil {
		return lease.Holder{}
	}
	e, err := kv.Get(context.Background(), consumer)
	if err != nil {
		return lease.Holder{}
	}
	var h lease.Holder
	if json.Unmarshal(e.Value(), &h) != nil || h.Released {
		return lease.Holder{}
	}
	return h
}

func leaseVars(b *bed, extra envVars) envVars {
	v := b.env(envVars{"AGG_CONSUMER": "agg-l", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"})
	for k, x := range extra {
		v[k] = x
	}
	return v
}

// TestSecondAggregatorWaits runs two aggregators of one AGG_CONSUMER over one stream: the
// second waits, ready, counting nothing, and shows it in aggregator_lease_held; once the
// first stops (SIGTERM), it takes over within a second or two, and the totals are exact.
func TestSecondAggregatorWaits(t *testing.T) {
	b := newBed(t)
	addrA, addrB := freeAddr(t), freeAddr(t)
	stopA := startAggregator(t, leaseVars(b, envVars{"HTTP_ADDR": addrA}))
	waitFor(t, 30*time.Second, "the first aggregator holds the lease", func() bool { return gauge(addrA, "aggregator_lease_held") == 1 })
	startAggregator(t, leaseVars(b, envVars{"HTTP_ADDR": addrB}))
	waitFor(t, 30*time.Second, "the second aggregator serves", func() bool { return gauge(addrB, "aggregator_lease_held") >= 0 })

	start := time.Now().UTC().Add(-time.Minute)
	b.publish(t, spreadEvents(3000, start))
	b.waitRows(t, time.Minute, 3000, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 3000, "SELECT count() FROM requests")
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 3000 {
		t.Fatalf("sum(requests) moved on to %d: both aggregators counted", got)
	}
	if held := gauge(addrB, "aggregator_lease_held"); held != 0 {
		t.Fatalf("aggregator_lease_held of the second aggregator = %v, want 0", held)
	}
	// Ready as it stands by, so that a rolling update goes on to stop the first.
	if code, body := readyz(addrB); code != http.StatusOK {
		t.Fatalf("/readyz of the waiting aggregator: %d %s", code, body)
	}
	if n := metricValue(addrB, "aggregator_events_total", ""); n != 0 {
		t.Fatalf("the waiting aggregator consumed %v messages", n)
	}
	if code, body := readyz(addrA); code != http.StatusOK {
		t.Fatalf("/readyz of the holder: %d %s", code, body)
	}

	stopped := time.Now()
	stopA()
	took := waitFor(t, 10*time.Second, "the second aggregator takes over", func() bool { return gauge(addrB, "aggregator_lease_held") == 1 })
	if d := took.Sub(stopped); d > 5*time.Second {
		t.Errorf("took over %s after the first stopped (its shutdown included)", d)
	}
	b.publish(t, spreadEvents(2000, start.Add(20*time.Second)))
	b.waitRows(t, time.Minute, 5000, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 5000, "SELECT count() FROM requests")
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 5000 {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != 5000 {
		t.Fatalf("%d distinct events in requests, want 5000", u)
	}
	checkRollupsPublished(t, b, "agg-l", 5000)
}

// TestKilledHolderTakenOverAfterTTL SIGKILLs the aggregator holding the lease mid-stream: the
// one waiting takes over once the lease has gone unrenewed for AGG_LEASE_TTL, not before,
// and the totals are exact.
func TestKilledHolderTakenOverAfterTTL(t *testing.T) {
	b := newBed(t)
	bin := buildBinary(t)
	const ttl = 3 * time.Second
	vars := leaseVars(b, envVars{"AGG_LEASE_TTL": ttl.String()})
	first := startProcess(t, bin, vars)
	waitFor(t, 30*time.Second, "the first process holds the lease", func() bool { return leaseHolder(t, b.js, "agg-l").PID == first.Process.Pid })
	second := startProcess(t, bin, vars)
	start := time.Now().UTC().Add(-time.Minute)
	b.publish(t, spreadEvents(3000, start))
	b.waitRows(t, 30*time.Second, 3000, "SELECT count() FROM requests")
	b.publish(t, spreadEvents(3000, start.Add(15*time.Second)))
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	_, _ = first.Process.Wait()
	took := waitFor(t, 3*ttl, "the waiting process takes over", func() bool { return leaseHolder(t, b.js, "agg-l").PID == second.Process.Pid })
	// The last renewal came at most a fifth of the TTL before the kill.
	if d := took.Sub(killed); d < ttl*4/5-200*time.Millisecond || d > ttl+2*time.Second {
		t.Errorf("took over %s after the kill, want about the TTL (%s)", d, ttl)
	}
	b.waitRows(t, time.Minute, 6000, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 6000, "SELECT count() FROM requests")
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 6000 {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != 6000 {
		t.Fatalf("%d distinct events in requests, want 6000", u)
	}
	checkRollupsPublished(t, b, "agg-l", 6000)
}

// TestCutOffHolderStopsCounting cuts the holder's NATS connection while it holds open windows
// (ClickHouse still reachable): it must stop before the waiting aggregator takes over and
// write nothing more — its windows would otherwise be stored by both — then stand by for the
// lease (it does not exit). The totals are exact.
func TestCutOffHolderStopsCounting(t *testing.T) {
	b := newBed(t)
	relay := startResettingRelay(t, strings.TrimPrefix(b.natsURL, "nats://"))
	const ttl = 3 * time.Second
	// A lateness longer than the TTL: the windows are still open when the waiter takes over.
	common := envVars{"AGG_LEASE_TTL": ttl.String(), "AGG_LATENESS": "8s"}
	addrA, addrB := freeAddr(t), freeAddr(t)
	varsA := leaseVars(b, common)
	varsA["NATS_URL"], varsA["HTTP_ADDR"] = relay.url(), addrA
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	doneA := make(chan error, 1)
	go func() { doneA <- run(ctx, varsA.get, testWriter{t}) }()
	waitFor(t, 30*time.Second, "the first aggregator holds the lease", func() bool { return gauge(addrA, "aggregator_lease_held") == 1 })
	varsB := leaseVars(b, common)
	varsB["HTTP_ADDR"] = addrB
	startAggregator(t, varsB)
	waitFor(t, 30*time.Second, "the second aggregator waits", func() bool { return gauge(addrB, "aggregator_lease_held") == 0 })

	evs := spreadEvents(2000, time.Time{})
	for i, base := 0, time.Now().UTC().Add(-time.Second); i < len(evs); i++ {
		evs[i].TS = base.Add(time.Duration(i) * 500 * time.Microsecond) // one second: closed 8 s from now
	}
	b.publish(t, evs)
	b.waitRows(t, 30*time.Second, 2000, "SELECT count() FROM requests") // consumed by the first
	if n := b.scalar(t, "SELECT count() FROM token_rollups"); n != 0 {
		t.Fatalf("%d rollups stored already: the windows should still be open", n)
	}
	relay.close()
	cut := time.Now()
	fencedAt := make(chan time.Time, 1) // when the cut-off aggregator said it stopped counting; zero: it did not
	go func() {
		for time.Since(cut) < 3*ttl {
			if gauge(addrA, "aggregator_lease_held") == 0 {
				fencedAt <- time.Now()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		fencedAt <- time.Time{}
	}()
	took := waitFor(t, 3*ttl, "the second aggregator takes over", func() bool { return gauge(addrB, "aggregator_lease_held") == 1 })
	// Both would store the windows: the totals tell whether the first stopped.
	b.waitRows(t, time.Minute, 2000, "SELECT sum(requests) FROM token_rollups")
	time.Sleep(2 * time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 2000 {
		t.Fatalf("sum(requests) moved on to %d: the cut-off aggregator went on writing", got)
	}
	fenced := <-fencedAt
	if d := fenced.Sub(cut); fenced.IsZero() || !took.After(fenced) || d > ttl || took.Sub(cut) < ttl*4/5-200*time.Millisecond {
		t.Errorf("cut at 0, the holder stopped at %s, the waiter took over at %s", d, took.Sub(cut))
	}
	// It stands by for the lease, as a second process would, rather than exit.
	select {
	case err := <-doneA:
		t.Fatalf("the cut-off aggregator stopped with %v; want it to stand by", err)
	default:
	}
	if held := gauge(addrA, "aggregator_lease_held"); held != 0 {
		t.Fatalf("aggregator_lease_held of the cut-off aggregator = %v, want 0", held)
	}
	cancel()
	select {
	case err := <-doneA:
		if err != nil {
			t.Fatalf("the cut-off aggregator, standing by, stopped with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cut-off aggregator did not stop")
	}
	if got := b.scalar(t, "SELECT count() FROM requests"); got != 2000 {
		t.Fatalf("count() FROM requests = %d, want 2000", got)
	}
}

// TestPausedHolderTakesItsLeaseBack pauses (SIGSTOP) the only aggregator past its fence while
// its windows are open: it stops counting as it resumes, drops them, and, since no other
// process took the lease, takes it back without exiting and counts again from its floor. Every
// event is counted once, those of the dropped windows included.
func TestPausedHolderTakesItsLeaseBack(t *testing.T) {
	b := newBed(t)
	bin := buildBinary(t)
	const ttl = 3 * time.Second
	// A lateness longer than the pause: the windows are open when it starts and ends.
	vars := leaseVars(b, envVars{"AGG_LEASE_TTL": ttl.String(), "AGG_LATENESS": "8s"})
	p := startProcess(t, bin, vars)
	waitFor(t, 30*time.Second, "the process holds the lease", func() bool { return leaseHolder(t, b.js, "agg-l").PID == p.Process.Pid })
	evs := spreadEvents(2000, time.Time{})
	for i, base := 0, time.Now().UTC().Add(-time.Second); i < len(evs); i++ {
		evs[i].TS = base.Add(time.Duration(i) * 500 * time.Microsecond) // one second: closed 8 s from now
	}
	b.publish(t, evs)
	b.waitRows(t, 30*time.Second, 2000, "SELECT count() FROM requests")
	if n := b.scalar(t, "SELECT count() FROM token_rollups"); n != 0 {
		t.Fatalf("%d rollups stored already: the windows should still be open", n)
	}
	kv, err := b.js.KeyValue(context.Background(), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	before, err := kv.Get(context.Background(), "agg-l")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl) // past the fence (two thirds of it)
	if err := p.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Renewed again: it holds the lease, and has not exited.
	waitFor(t, 3*ttl, "the process renews its lease again", func() bool {
		e, err := kv.Get(context.Background(), "agg-l")
		return err == nil && e.Revision() > before.Revision()+1 && leaseHolder(t, b.js, "agg-l").PID == p.Process.Pid
	})
	b.publish(t, spreadEvents(1000, time.Now().UTC()))
	b.waitRows(t, time.Minute, 3000, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 3000, "SELECT count() FROM requests")
	time.Sleep(2 * time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 3000 {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != 3000 {
		t.Fatalf("%d distinct events in requests, want 3000", u)
	}
	if got := b.scalar(t, "SELECT count() FROM requests"); got != 3000 {
		t.Fatalf("count() FROM requests = %d, want 3000", got)
	}
	checkRollupsPublished(t, b, "agg-l", 3000)
}

// TestShutdownDuringOutageLeavesLease stops the holder (SIGTERM) while ClickHouse hangs with a
// flush in flight: the insert it gives up on may still run once the server reads its socket,
// so it does not release the lease; the next process waits for it to go stale, as after a
// crash, rather than read the ledger at once and count the flush again. The totals are exact.
func TestShutdownDuringOutageLeavesLease(t *testing.T) {
	if testing.Short() {
		t.Skip("hangs ClickHouse for about 20 s")
	}
	b := newBed(t)
	srv := testbed.Server(t)
	vars := leaseVars(b, envVars{"AGG_CONSUMER": "agg-u", "AGG_WRITE_TIMEOUT": "2s", "AGG_LEASE_TTL": "5s"})
	stop := startAggregator(t, vars)
	start := time.Now().UTC().Add(-time.Minute)
	b.publish(t, spreadEvents(500, start))
	b.waitRows(t, 30*time.Second, 500, "SELECT count() FROM requests")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	b.publish(t, spreadEvents(1000, start.Add(10*time.Second)))
	time.Sleep(2 * time.Second) // flushes of these events are now hanging on ClickHouse
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		_ = srv.Resume()
		t.Fatal("the aggregator did not stop within 40 s while ClickHouse hung")
	}
	h := leaseHolder(t, b.js, "agg-u")
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if h.PID == 0 {
		t.Fatal("the lease was released though a write to ClickHouse was left unfinished")
	}
	startAggregator(t, vars)
	b.waitRows(t, time.Minute, 1500, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 1500, "SELECT count() FROM requests")
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 1500 {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
}
