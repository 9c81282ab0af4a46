package main

import (
	"cmp"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// buildBinary builds the aggregator for tests that kill it.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "aggregator")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cannot build the aggregator: %v\n%s", err, out)
	}
	return bin
}

func startProcess(t *testing.T, bin string, vars envVars) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	log, err := os.OpenFile(filepath.Join(t.TempDir(), "aggregator.log"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		log.Close()
	})
	return cmd
}

// killWhilePublishing runs the aggregator binary and SIGKILLs it after a random uptime of
// minUp to minUp+spread (from seed) counted from when it holds the lease, starting it again
// each time, until published is closed and it has been killed at least minKills times; the
// last process runs on. It returns the kills. A killed process's lease holds the next off for
// AGG_LEASE_TTL: unless vars set it, 2s.
func killWhilePublishing(t *testing.T, bin string, vars envVars, published <-chan struct{}, minKills int, minUp, spread time.Duration, seed uint64) int {
	t.Helper()
	if vars["AGG_LEASE_TTL"] == "" {
		vars = maps.Clone(vars)
		vars["AGG_LEASE_TTL"] = "2s"
	}
	nc, err := nats.Connect(vars["NATS_URL"])
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	consumer := cmp.Or(vars["AGG_CONSUMER"], "aggregator")
	r := rand.New(rand.NewPCG(seed, seed+1))
	for kills := 0; ; kills++ {
		cmd := startProcess(t, bin, vars)
		waitFor(t, 30*time.Second, "the restarted aggregator holds the lease", func() bool { return leaseHolder(t, js, consumer).PID == cmd.Process.Pid })
		time.Sleep(minUp + time.Duration(r.Int64N(int64(spread))))
		select {
		case <-published:
			if kills >= minKills {
				t.Logf("killed the aggregator %d times", kills)
				return kills
			}
		default:
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, _ = cmd.Process.Wait()
	}
}

// TestCrashExactlyOnce SIGKILLs the aggregator process at random points, at least five
// times, while 100,000 events built from the real trace are published, restarting it each
// time. The totals in ClickHouse must equal the events published exactly — rollups and raw
// requests alike — with plain sum() and no FINAL.
func TestCrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 100k events and kills the aggregator repeatedly")
	}
	rows := readTrace(t, 20_000)
	b := newBed(t)
	bin := buildBinary(t)
	const n = 100_000
	// 100k events over 50 s of event time ending a minute ago: 25 two-second windows.
	base := time.Now().UTC().Add(-2 * time.Minute).Truncate(2 * time.Second)
	var evs []events.RequestEvent
	for len(evs) < n {
		evs = append(evs, buildEvents(rows, base, uint64(len(evs)))...)
	}
	evs = evs[:n]
	for i := range evs {
		evs[i].TS = base.Add(time.Duration(i) * 500 * time.Microsecond)
	}
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"})

	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := 0; i < n; i += 2000 {
			b.publish(t, evs[i:min(i+2000, n)])
			time.Sleep(150 * time.Millisecond) // about 8 s in all, so the kills land mid-run
		}
	}()
	killWhilePublishing(t, bin, vars, published, 5, 500*time.Millisecond, 1500*time.Millisecond, 42)
	b.waitRows(t, 2*time.Minute, n, "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, n, "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != n {
		t.Fatalf("%d distinct events in requests, want %d", u, n)
	}
	var wantOut uint64
	for _, e := range evs {
		wantOut += uint64(e.OutputTokens)
	}
	if got := b.scalar(t, "SELECT sum(output_tokens) FROM token_rollups"); got != wantOut {
		t.Fatalf("sum(output_tokens) = %d, want %d", got, wantOut)
	}
	// And nothing more arrives later: the totals are final, not on their way past n.
	time.Sleep(time.Second)
	if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != n {
		t.Fatalf("sum(requests) moved on to %d", got)
	}
	// Every stored rollup is on ROLLUPS once, whatever the kills cut off.
	checkPublished(t, b, "aggregator", tokenRollups, n)
}

// TestKillBeforeRollupAcks stores flushes while JetStream cannot take the rollups (ROLLUPS
// no longer listens on rollup.>), SIGKILLs the aggregator between the store and the acks,
// and starts it again once ROLLUPS is back: the restarted aggregator publishes the rollups
// of those stored flushes again, so every stored rollup is on ROLLUPS exactly once by message
// id and the totals there match ClickHouse's.
func TestKillBeforeRollupAcks(t *testing.T) {
	b := newBed(t)
	bin := buildBinary(t)
	vars := b.env(envVars{"AGG_CONSUMER": "agg-k", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn",
		"AGG_LEASE_TTL": "2s"}) // the restart waits for the killed process's lease
	cmd := startProcess(t, bin, vars)
	start := time.Now().UTC().Add(-90 * time.Second)
	b.publish(t, spreadEvents(1000, start))
	b.waitRows(t, time.Minute, 1000, "SELECT sum(requests) FROM token_rollups")

	restore := b.divertStream(t, events.StreamRollups)
	b.publish(t, spreadEvents(1000, start.Add(10*time.Second)))
	// The first flush of these is stored, then the pipeline holds for its acks.
	for deadline := time.Now().Add(time.Minute); b.scalar(t, "SELECT sum(requests) FROM token_rollups") <= 1000; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no flush stored while ROLLUPS was away")
		}
	}
	if n := b.scalar(t, "SELECT count() FROM rollup_outbox WHERE consumer = 'agg-k'"); n == 0 {
		t.Fatal("nothing in rollup_outbox")
	}
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	if ids, _, _ := rollupsOnStream(t, b, "agg-k", tokenRollups); uint64(len(ids)) >= b.scalar(t, "SELECT count() FROM token_rollups") {
		t.Fatalf("all %d rollups on ROLLUPS before the kill: the test cut nothing off", len(ids))
	}

	restore()
	startProcess(t, bin, vars)
	b.publish(t, spreadEvents(1000, start.Add(20*time.Second)))
	b.waitRows(t, time.Minute, 3000, "SELECT sum(requests) FROM token_rollups")
	checkRollupsPublished(t, b, "agg-k", 3000)
}

// TestClickHouseOutage pauses ClickHouse for 30 s in the middle of a run: the aggregator
// holds its windows, retries, catches up when the server answers again, and loses and
// doubles nothing.
func TestClickHouseOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses ClickHouse for 30 s")
	}
	rows := readTrace(t, 3000)
	b := newBed(t)
	srv := testbed.Server(t)
	if err := srv.Pause(); err != nil {
		t.Skipf("cannot pause this ClickHouse: %v", err)
	}
	srv.Resume()
	addr := freeAddr(t)
	startAggregator(t, b.env(envVars{"HTTP_ADDR": addr, "AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "200ms",
		"AGG_WRITE_TIMEOUT": "2s", "AGG_MAX_BUFFERED": "1000",
		"AGG_LEASE_TTL": "2m"})) // a machine as loaded as the outage's retries make it must not fence the lease
	now := time.Now().UTC()
	evs := buildEvents(rows, now.Add(-time.Minute), 7)
	for i := range evs {
		evs[i].TS = now.Add(-40 * time.Second).Add(time.Duration(i) * 10 * time.Millisecond)
	}
	b.publish(t, evs[:1000])
	b.waitRows(t, 30*time.Second, 1000, "SELECT count() FROM requests")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	b.publish(t, evs[1000:])
	// 2,000 events arrive while ClickHouse is away: past AGG_MAX_BUFFERED the aggregator
	// stops pulling instead of growing or dropping.
	deadline := time.Now().Add(30 * time.Second)
	paused := false
	for time.Now().Before(deadline) {
		if metricValue(addr, "aggregator_paused", `stream="tokens"`) == 1 {
			paused = true
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !paused {
		t.Error("the aggregator never paused pulling at its memory bound")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, 30*time.Second, uint64(len(evs)), "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != uint64(len(evs)) {
		t.Fatalf("%d distinct events, want %d", u, len(evs))
	}
}

// TestShutdownDuringOutage stops the aggregator while ClickHouse hangs with a flush in
// flight, then starts it again once ClickHouse is back: the interrupted flush is neither lost
// nor claimed by a later one, and the totals are exact.
func TestShutdownDuringOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("hangs ClickHouse for about 20 s")
	}
	rows := readTrace(t, 2000)
	b := newBed(t)
	srv := testbed.Server(t)
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "200ms", "AGG_WRITE_TIMEOUT": "2s"})
	stop := startAggregator(t, vars)
	now := time.Now().UTC()
	evs := buildEvents(rows, now, 11)
	for i := range evs {
		evs[i].TS = now.Add(-time.Minute).Add(time.Duration(i) * 10 * time.Millisecond)
	}
	b.publish(t, evs[:500])
	b.waitRows(t, 30*time.Second, 500, "SELECT count() FROM requests")
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	b.publish(t, evs[500:1500])
	time.Sleep(2 * time.Second) // flushes of these events are now hanging on ClickHouse
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(40 * time.Second):
		srv.Resume()
		t.Fatal("the aggregator did not stop within 40 s while ClickHouse hung")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	b.publish(t, evs[1500:])
	startAggregator(t, vars)
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT sum(requests) FROM token_rollups")
	b.waitRows(t, time.Minute, uint64(len(evs)), "SELECT count() FROM requests")
	if u := b.scalar(t, "SELECT uniqExact(event_id) FROM requests"); u != uint64(len(evs)) {
		t.Fatalf("%d distinct events in requests, want %d", u, len(evs))
	}
	time.Sleep(time.Second)
	if n := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); n != uint64(len(evs)) {
		t.Fatalf("sum(requests) moved on to %d", n)
	}
}
