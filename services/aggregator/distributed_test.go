package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/chserver"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// shardKeys are the sharding keys of the Distributed tables, as the README's cluster layout
// gives them: a flush's rollups go to one shard, so that the insert of a flush is all or
// nothing and its rows can be counted by flush_id; raw requests spread evenly.
var shardKeys = map[string]string{
	"requests":      "rand()",
	"token_rollups": "cityHash64(consumer, flush_id)",
	"gpu_rollups":   "cityHash64(consumer, flush_id)",
	"host_rollups":  "cityHash64(consumer, flush_id)",
	"alerts":        "cityHash64(fingerprint)",
}

// shardedClickHouse starts two ClickHouse servers as the two shards of cluster tokenscope,
// with the migrator's tables in database tokenscope_local on each and, in database
// tokenscope, a Distributed table of the same name over them, as the README lays a cluster
// out.
func shardedClickHouse(t *testing.T) [2]*testbed.ClickHouseServer {
	t.Helper()
	var shards [2]*testbed.ClickHouseServer
	for i := range shards {
		s, err := testbed.StartClickHouse(filepath.Join(t.TempDir(), "ch"))
		if err != nil {
			if errors.Is(err, chserver.ErrNotInstalled) && os.Getenv("CI") != "true" {
				t.Skipf("ClickHouse is not installed (%v); install it with: %s", err, testbed.InstallHint)
			}
			t.Fatalf("cannot start ClickHouse shard %d: %v", i+1, err)
		}
		t.Cleanup(s.Stop)
		shards[i] = s
	}
	var replicas string
	for _, s := range shards {
		_, port, _ := net.SplitHostPort(s.Addr)
		replicas += fmt.Sprintf("<shard><replica><host>127.0.0.1</host><port>%s</port></replica></shard>", port)
	}
	cluster := `<?xml version="1.0"?><yandex><remote_servers><tokenscope>` + replicas + `</tokenscope></remote_servers></yandex>`
	ctx := context.Background()
	for i, s := range shards {
		if err := s.AddConfig("config.d/cluster.xml", cluster); err != nil {
			t.Fatal(err)
		}
		local := openDB(t, s, "tokenscope_local")
		if _, err := local.Migrate(ctx, schemas.Migrations()); err != nil {
			t.Fatalf("shard %d: %v", i+1, err)
		}
		dist := openDB(t, s, "tokenscope")
		deadline := time.Now().Add(30 * time.Second)
		for { // the server reloads config.d within seconds
			var n uint64
			if err := dist.Conn().QueryRow(ctx, "SELECT count() FROM system.clusters WHERE cluster = 'tokenscope'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("shard %d has not loaded the cluster after 30s", i+1)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for table, key := range shardKeys {
			q := fmt.Sprintf("CREATE TABLE IF NOT EXISTS tokenscope.%[1]s AS tokenscope_local.%[1]s ENGINE = Distributed(tokenscope, tokenscope_local, %[1]s, %[2]s)", table, key)
			if err := dist.Conn().Exec(ctx, q); err != nil {
				t.Fatalf("shard %d: %s: %v", i+1, q, err)
			}
		}
	}
	return shards
}

func openDB(t *testing.T, s *testbed.ClickHouseServer, db string) *chdb.DB {
	t.Helper()
	d, err := chdb.Open(context.Background(), chdb.Config{Addr: s.Addr, HTTPAddr: s.HTTPAddr, DB: db, User: "default", DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestDistributedShardOutage runs the aggregator against two ClickHouse shards behind
// Distributed tables and takes the shard it is not connected to down in the middle of the
// run: writes are held (nothing is stored on the live shard either), an aggregator restarted
// during the outage waits for its ledger instead of exiting, and once the shard is back the
// totals are exact, every event stored once. The node the aggregator uses skips unavailable
// shards in its default profile, as a node serving dashboards may: the ledger must still be
// read in full, not from the live shard alone.
func TestDistributedShardOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two ClickHouse servers")
	}
	shards := shardedClickHouse(t)
	a := shards[0]
	skip := `<?xml version="1.0"?><yandex><profiles><default><skip_unavailable_shards>1</skip_unavailable_shards></default></profiles></yandex>`
	if err := a.AddConfig("users.d/skip.xml", skip); err != nil {
		t.Fatal(err)
	}
	srv := testbed.NATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	chCfg := chdb.Config{Addr: a.Addr, HTTPAddr: a.HTTPAddr, DB: "tokenscope", User: "default", DialTimeout: 5 * time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; { // a new connection has the reloaded profile
		d := openDB(t, a, "default")
		skips := scalarIn(t, d, "SELECT toUInt64(value) FROM system.settings WHERE name = 'skip_unavailable_shards'")
		d.Close()
		if skips == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the profile skipping unavailable shards is not in use after 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	b := &bed{natsURL: srv.ClientURL(), ch: chCfg, db: openDB(t, a, "tokenscope"), js: js, nc: nc}
	localA := openDB(t, a, "tokenscope_local")
	// 30 s windows over 60 s of events in three phases: a window holding events of the first
	// phase is still open when the shard goes down, so the restart replays stored events and
	// only the ledger tells which.
	vars := b.env(envVars{"AGG_WINDOW": "30s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"})

	const n = 30_000
	base := time.Now().UTC().Add(-2 * time.Minute)
	evs := make([]events.RequestEvent, n)
	for i := range evs {
		evs[i] = events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * 2 * time.Millisecond), Model: "m",
			Scene: []string{"chat", "search", "code"}[i%3], Env: "prod", InputTokens: int64(10 + i%5000), OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	stop := startAggregator(t, vars)
	b.publish(t, evs[:n/3])
	b.waitRows(t, time.Minute, n/3, "SELECT count() FROM requests")

	if err := shards[1].Halt(); err != nil {
		t.Fatal(err)
	}
	heldAt := scalarIn(t, localA, "SELECT count() FROM requests")
	b.publish(t, evs[n/3:2*n/3])
	time.Sleep(3 * time.Second)
	if got := scalarIn(t, localA, "SELECT count() FROM requests"); got != heldAt {
		t.Fatalf("the live shard's requests went from %d to %d while the other shard was down: inserts did not wait for every shard", heldAt, got)
	}

	stop()
	exited := make(chan error, 1)
	rctx, cancel := context.WithCancel(context.Background())
	go func() { exited <- run(rctx, vars.get, testWriter{t}) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-exited; err != nil {
				t.Errorf("aggregator: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	b.publish(t, evs[2*n/3:])
	select {
	case err := <-exited:
		stopped = true
		t.Fatalf("the aggregator restarted during the outage stopped: %v", err)
	case <-time.After(5 * time.Second):
	}

	if err := shards[1].Restart(); err != nil {
		t.Fatal(err)
	}
	b.waitRows(t, 2*time.Minute, n, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, n, "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != n {
		t.Fatalf("%d distinct events in requests, want %d", u, n)
	}
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != n {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
	if got := b.scalar(t, "SELECT count() FROM requests"); got != n {
		t.Fatalf("count() of requests moved on to %d", got)
	}
	stop()

	localB := openDB(t, shards[1], "tokenscope_local")
	ra, rb := scalarIn(t, localA, "SELECT count() FROM requests"), scalarIn(t, localB, "SELECT count() FROM requests")
	if ra == 0 || rb == 0 {
		t.Errorf("requests: %d rows on shard 1, %d on shard 2; rand() should spread them", ra, rb)
	}
	onA, onB := flushIDs(t, localA), flushIDs(t, localB)
	for id := range onB {
		if onA[id] {
			t.Errorf("the rollups of flush %s are on both shards; the sharding key should keep a flush on one", id)
		}
	}
	t.Logf("requests: %d on shard 1, %d on shard 2; rollup flushes: %d on shard 1, %d on shard 2", ra, rb, len(onA), len(onB))
}

func flushIDs(t *testing.T, db *chdb.DB) map[string]bool {
	t.Helper()
	rows, err := db.Conn().Query(context.Background(), "SELECT DISTINCT flush_id FROM token_rollups")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	return ids
}

func scalarIn(t *testing.T, db *chdb.DB, q string) uint64 {
	t.Helper()
	var n uint64
	if err := db.Conn().QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestPartlyStoredBatch: a batch of raw requests that an earlier attempt stored in part (a
// Distributed insert that one shard committed and another failed leaves that) is completed
// by the retry, which writes only the positions missing, and no event is stored twice.
func TestPartlyStoredBatch(t *testing.T) {
	b := newBed(t)
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "1s", "AGG_GPU": "false", "AGG_LOG_LEVEL": "error"}))
	const n = 2000
	base := time.Now().UTC().Add(-2 * time.Minute)
	evs := make([]events.RequestEvent, n)
	for i := range evs {
		evs[i] = events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: base.Add(time.Duration(i) * 10 * time.Millisecond), Model: "m",
			Scene: "chat", Env: "prod", InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
	}
	b.publish(t, evs[:1]) // stream position 1
	b.waitRows(t, 30*time.Second, 1, "SELECT count() FROM requests")

	// Inserts fail while the table is away; the flush holding positions 2… is retried.
	ctx := context.Background()
	if err := b.db.Conn().Exec(ctx, "RENAME TABLE requests TO requests_away"); err != nil {
		t.Fatal(err)
	}
	b.publish(t, evs[1:])
	time.Sleep(3 * time.Second)
	// Position 2, the first of the held batch, is stored, as a failed attempt may leave it.
	batch, err := b.db.Conn().PrepareBatch(ctx, "INSERT INTO requests_away (ts, event_id, env, scene, model, bucket, status, consumer, stream_seq)")
	if err != nil {
		t.Fatal(err)
	}
	e := &evs[1]
	if err := batch.Append(e.TS, e.EventID, e.Env, e.Scene, e.Model, "0-500", string(e.Status), "aggregator", uint64(2)); err != nil {
		t.Fatal(err)
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	if err := b.db.Conn().Exec(ctx, "RENAME TABLE requests_away TO requests"); err != nil {
		t.Fatal(err)
	}

	b.waitRows(t, time.Minute, n, "SELECT count() FROM requests")
	b.waitRows(t, time.Minute, n, "SELECT sum(requests) FROM token_rollups")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != n {
		t.Fatalf("%d distinct events in requests, want %d", u, n)
	}
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT count() FROM requests"); got != n {
		t.Fatalf("count() of requests moved on to %d", got)
	}
}
