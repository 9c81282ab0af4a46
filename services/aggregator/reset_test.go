package main

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
)

// resettingRelay forwards TCP connections to target and, once told to, resets every connection
// it holds (RST, not FIN) at random intervals in [every/2, every*3/2): what a NAT, a load balancer or a
// flaky link does to the aggregator's NATS connection. Whatever sat in the dying connection
// is gone.
type resettingRelay struct {
	relayConns
	ln     net.Listener
	resets int
	done   chan struct{}
	wg     sync.WaitGroup
}

func startResettingRelay(t testing.TB, target string) *resettingRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &resettingRelay{relayConns: relayConns{target: target, conns: map[net.Conn]struct{}{}}, ln: ln, done: make(chan struct{})}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

// startResetting begins resetting every ~every.
func (r *resettingRelay) startResetting(every time.Duration) {
	r.wg.Add(1)
	go r.resetLoop(every)
}

func (r *resettingRelay) url() string { return "nats://" + r.ln.Addr().String() }

func (r *resettingRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.forward(c)
	}
}

func (r *resettingRelay) resetLoop(every time.Duration) {
	defer r.wg.Done()
	rnd := rand.New(rand.NewPCG(7, 8))
	for {
		select {
		case <-r.done:
			return
		case <-time.After(every/2 + time.Duration(rnd.Int64N(int64(every)))):
		}
		r.mu.Lock()
		conns := r.heldLocked()
		if len(conns) > 0 {
			r.resets++
		}
		r.mu.Unlock()
		for _, c := range conns {
			r.drop(c)
		}
	}
}

func (r *resettingRelay) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resets
}

// stopResetting leaves the connections alone from now on.
func (r *resettingRelay) stopResetting() (resets int) {
	select {
	case <-r.done:
	default:
		close(r.done)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.resets
}

func (r *resettingRelay) close() {
	r.stopResetting()
	r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// waitAtLeast polls until q returns at least want.
func (b *bed) waitAtLeast(t testing.TB, timeout time.Duration, want uint64, q string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var got uint64
		_ = b.db.Conn().QueryRow(context.Background(), q).Scan(&got)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d after %s, want at least %d", q, got, timeout, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConnectionResets reads a backlog of 60,000 events, and then a live flow of 20,000 more,
// through a relay that resets the aggregator's NATS connection every ~400 ms. Messages that
// were in the dying connection are delivered again from the last one processed: the totals
// in ClickHouse are exact, rollups and raw requests alike.
func TestConnectionResets(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 80k events through a resetting relay")
	}
	b := newBed(t)
	relay := startResettingRelay(t, b.natsURL[len("nats://"):])
	const backlog, live = 60_000, 20_000
	base := time.Now().UTC().Add(-2 * time.Minute).Truncate(2 * time.Second)
	evs := make([]events.RequestEvent, backlog+live)
	var wantOut uint64
	for i := range evs {
		evs[i] = events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * time.Millisecond),
			Model: []string{"m1", "m2"}[i%2], Scene: "chat", Env: "prod", InputTokens: int64(10 + i%3000), OutputTokens: int64(1 + i%50),
			TTFTMs: float64(20 + i%100), TotalMs: float64(200 + i%1000), Status: events.StatusOK, Stream: true}
		wantOut += uint64(evs[i].OutputTokens)
	}
	b.publish(t, evs[:backlog])
	vars := b.env(envVars{"NATS_URL": relay.url(), "AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms",
		"AGG_PULL_BATCH": "2000", "AGG_GPU": "false", "AGG_LOG_LEVEL": "warn",
		// A connection reset every 400 ms can cut every renewal for two thirds of the default
		// TTL on a loaded machine, and the holder would stop counting: the test is the
		// delivery, not the lease.
		"AGG_LEASE_TTL": "10m"})
	startAggregator(t, vars)
	// Resets start once the aggregator is consuming: one during its start would stop it, as
	// any failure to set up does.
	b.waitAtLeast(t, 30*time.Second, 1, "SELECT count() FROM requests")
	relay.startResetting(400 * time.Millisecond)
	for i := backlog; i < len(evs); i += 1000 {
		b.publish(t, evs[i:i+1000])
		time.Sleep(100 * time.Millisecond)
	}
	// Resetting stops only once every event was published and the connection was reset a few
	// times (each reconnect waits a second); what is lost by then must come back by itself.
	deadline := time.Now().Add(30 * time.Second)
	for relay.count() < 6 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	resets := relay.stopResetting()
	if resets < 6 {
		t.Fatalf("the relay reset the connection %d times, want at least 6", resets)
	}
	t.Logf("the relay reset the aggregator's connection %d times", resets)
	n := uint64(len(evs))
	b.waitRows(t, 2*time.Minute, n, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, n, "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != n {
		t.Fatalf("%d distinct events in requests, want %d", u, n)
	}
	if got := b.scalar(t, "SELECT sum(output_tokens) FROM token_rollups"); got != wantOut {
		t.Fatalf("sum(output_tokens) = %d, want %d", got, wantOut)
	}
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != n {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
}

// TestRewoundFloorFillsMissingRequests: the requests ledger lists what was stored, position by
// position, so requests missing from the table (here deleted by hand) are written again when
// an operator rewinds the floor, while the rollups, already complete, are not counted twice.
func TestRewoundFloorFillsMissingRequests(t *testing.T) {
	b := newBed(t)
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_GPU": "false"})
	old := time.Now().UTC().Add(-time.Minute)
	evs := make([]events.RequestEvent, 1000)
	for i := range evs {
		evs[i] = events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: old.Add(time.Duration(i) * time.Millisecond), Model: "m", Scene: "chat",
			Env: "prod", InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	b.publish(t, evs)
	stop := startAggregator(t, vars)
	b.waitRows(t, 30*time.Second, 1000, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, 1000, "SELECT count() FROM requests")
	stop()
	ctx := context.Background()
	if err := b.db.Conn().Exec(ctx, "ALTER TABLE requests DELETE WHERE stream_seq % 100 = 7"); err != nil {
		t.Fatal(err)
	}
	b.waitRows(t, 30*time.Second, 990, "SELECT count() FROM requests")
	kv, err := b.js.KeyValue(ctx, pipeline.FloorBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.StreamEvents+".aggregator", []byte("0")); err != nil {
		t.Fatal(err)
	}
	startAggregator(t, vars)
	b.waitRows(t, 30*time.Second, 1000, "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != 1000 {
		t.Fatalf("%d distinct events in requests, want 1000", u)
	}
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != 1000 {
		t.Fatalf("sum(requests) = %d after the rewound replay, want 1000", got)
	}
	if got := b.scalar(t, "SELECT count() FROM requests"); got != 1000 {
		t.Fatalf("count() of requests moved on to %d", got)
	}
}
