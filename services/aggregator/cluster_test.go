package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestClusterLosesStreamLeader runs the aggregator against a 3-node NATS cluster with R3
// streams, as the scaling guide deploys it, and shuts down the node leading LLM_EVENTS in the
// middle of the run: the stream moves to another leader, the aggregator follows it, and the
// totals in ClickHouse are exact.
func TestClusterLosesStreamLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node NATS cluster")
	}
	servers := testbed.NATSCluster(t, 3)
	urls := make([]string, len(servers))
	for i, s := range servers {
		urls[i] = s.ClientURL()
	}
	natsURL := strings.Join(urls, ",")
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	chCfg := testbed.ClickHouse(t)
	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	b := &bed{natsURL: natsURL, ch: chCfg, db: db, js: js, nc: nc}
	startAggregator(t, b.env(envVars{"NATS_STREAM_REPLICAS": "3", "AGG_WINDOW": "2s", "AGG_LATENESS": "1s",
		"AGG_FLUSH_INTERVAL": "100ms", "AGG_GPU": "false", "AGG_LOG_LEVEL": "warn"}))

	const n = 20_000
	base := time.Now().UTC().Add(-2 * time.Minute)
	evs := make([]events.RequestEvent, n)
	for i := range evs {
		evs[i] = events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * 2 * time.Millisecond), Model: "m",
			Scene: "chat", Env: "prod", InputTokens: int64(10 + i%5000), OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	killed := false
	for i := 0; i < n; i += 500 {
		publishRetrying(t, js, evs[i:i+500])
		if i == n/2 && !killed {
			b.waitAtLeast(t, 2*time.Minute, 1000, "SELECT count() FROM requests")
			// The leader goes once the replicas have all it took: the test is of a leader
			// lost, not of a replica still catching up.
			testbed.WaitStreamCurrent(t, servers, server0Account, events.StreamEvents, len(servers))
			for _, s := range servers {
				if s.JetStreamIsStreamLeader(server0Account, events.StreamEvents) {
					t.Logf("shutting down %s, the leader of %s", s.Name(), events.StreamEvents)
					s.Shutdown()
					killed = true
					break
				}
			}
			if !killed {
				t.Fatal("no server leads LLM_EVENTS")
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.waitRows(t, 3*time.Minute, n, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, n, "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != n {
		t.Fatalf("%d distinct events in requests, want %d", u, n)
	}
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != n {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
}

// server0Account is the account of a server without accounts configured.
const server0Account = "$G"

// publishRetrying publishes evs, retrying each one whose acknowledgement fails (a stream
// leader being elected) with the same Nats-Msg-Id, so JetStream keeps it once.
func publishRetrying(t *testing.T, js jetstream.JetStream, evs []events.RequestEvent) {
	t.Helper()
	msgs := make([]*nats.Msg, len(evs))
	futures := make([]jetstream.PubAckFuture, len(evs))
	for i := range evs {
		m := nats.NewMsg(events.RequestSubject(evs[i].Env, evs[i].Scene))
		m.Data = events.AppendRequest(nil, &evs[i])
		m.Header.Set(jetstream.MsgIDHeader, evs[i].EventID)
		msgs[i] = m
		futures[i], _ = js.PublishMsgAsync(m)
	}
	for i, f := range futures {
		if f != nil {
			select {
			case <-f.Ok():
				continue
			case <-f.Err():
			case <-time.After(5 * time.Second):
			}
		}
		deadline := time.Now().Add(2 * time.Minute) // a bound for a leader elected on a loaded machine
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.PublishMsg(ctx, msgs[i])
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cannot publish event %d: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
