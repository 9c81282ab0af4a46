package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// hostSamples makes n samples a second apart per host from base: memory used rises by a
// KiB a second, disk and network rates are whole numbers of bytes per second.
func hostSamples(hosts []string, base time.Time, n int) []events.HostSample {
	var out []events.HostSample
	for i := range n {
		for h, host := range hosts {
			u, a, tot := uint64(1<<30+i*1024), uint64(3<<30-i*1024), uint64(4<<30)
			s := events.HostSample{V: 1, TS: base.Add(time.Duration(i) * time.Second), Host: host,
				MemTotalBytes: &tot, MemUsedBytes: &u, MemAvailableBytes: &a}
			if i > 0 {
				dt, r, w, rx, tx := 1.0, float64(1000*(i%7)+h), float64(10*i), float64(5000+i), float64(h*100)
				s.DeltaSeconds, s.DiskReadBps, s.DiskWriteBps, s.NetRxBps, s.NetTxBps = &dt, &r, &w, &rx, &tx
			}
			out = append(out, s)
		}
	}
	return out
}

func (b *bed) publishHost(t testing.TB, samples []events.HostSample) {
	t.Helper()
	publishAll(t, b.js, samples, func(s *events.HostSample) (string, string, []byte, error) {
		data, err := events.MarshalHostSample(s)
		return events.HostSampleSubject(s.Host), s.Host + "/host/" + events.FormatTS(s.TS), data, err
	})
}

// hostTotals are what the rollups of samples must add up to.
type hostTotals struct {
	samples           uint64
	diskRead, netRx   float64 // bytes
	memUsedMax        uint64
	memAvailableMin   uint64
	diskSeconds, rxMx float64
}

func wantHost(samples []events.HostSample) hostTotals {
	w := hostTotals{memAvailableMin: math.MaxUint64}
	for _, s := range samples {
		w.samples++
		w.memUsedMax = max(w.memUsedMax, *s.MemUsedBytes)
		w.memAvailableMin = min(w.memAvailableMin, *s.MemAvailableBytes)
		if s.DeltaSeconds != nil {
			w.diskRead += *s.DiskReadBps * *s.DeltaSeconds
			w.netRx += *s.NetRxBps * *s.DeltaSeconds
			w.diskSeconds += *s.DeltaSeconds
			w.rxMx = max(w.rxMx, *s.NetRxBps)
		}
	}
	return w
}

func (b *bed) hostTotals(t testing.TB) hostTotals {
	t.Helper()
	var g hostTotals
	q := `SELECT sum(samples), sum(disk_read_avg_bps * disk_seconds), sum(net_rx_avg_bps * net_seconds),
		max(mem_used_max_bytes), min(mem_available_min_bytes), sum(disk_seconds), max(net_rx_max_bps) FROM host_rollups`
	if err := b.db.Conn().QueryRow(context.Background(), q).Scan(&g.samples, &g.diskRead, &g.netRx, &g.memUsedMax, &g.memAvailableMin, &g.diskSeconds, &g.rxMx); err != nil {
		t.Fatal(err)
	}
	return g
}

func checkHostTotals(t testing.TB, got, want hostTotals) {
	t.Helper()
	close := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6*max(1, math.Abs(b)) }
	if got.samples != want.samples || got.memUsedMax != want.memUsedMax || got.memAvailableMin != want.memAvailableMin ||
		!close(got.diskRead, want.diskRead) || !close(got.netRx, want.netRx) || !close(got.diskSeconds, want.diskSeconds) || got.rxMx != want.rxMx {
		t.Fatalf("host_rollups add up to %+v, want %+v", got, want)
	}
}

// TestHostRollups: host samples of two hosts become one host_rollups row per window ×
// host whose means, weighted by the seconds they cover, give back the bytes moved, and each
// row is published on rollup.host.<host> once stored. A host sample that breaks the
// contract is a dead letter and changes nothing.
func TestHostRollups(t *testing.T) {
	b := newBed(t)
	dead, err := b.nc.SubscribeSync(events.SubjectInvalid)
	if err != nil {
		t.Fatal(err)
	}
	startAggregator(t, b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms"}))
	base := time.Now().UTC().Add(-time.Minute).Truncate(2 * time.Second)
	samples := hostSamples([]string{"gpu-node-1", "gpu-node.2"}, base, 10) // 5 windows × 2 hosts
	b.publishHost(t, samples)
	b.publishRaw(t, "host.sample.gpu-node-1", []byte(`{"v":1,"ts":"`+events.FormatTS(base)+`","host":"gpu-node-1","mem_total_bytes":1,"mem_used_bytes":2}`))
	b.waitRows(t, 30*time.Second, 20, "SELECT sum(samples) FROM host_rollups")
	checkHostTotals(t, b.hostTotals(t), wantHost(samples))
	if n := b.scalar(t, "SELECT count() FROM host_rollups"); n != 10 {
		t.Fatalf("%d rows, want 10 (5 windows × 2 hosts)", n)
	}
	// One window of one host, exactly: seconds 2 and 3 of gpu-node.2 (h = 1).
	var memAvg, readAvg, readMax, rxAvg, txMax, diskSec float64
	if err := b.db.Conn().QueryRow(context.Background(), `SELECT mem_used_avg_bytes, disk_read_avg_bps, disk_read_max_bps, net_rx_avg_bps, net_tx_max_bps, disk_seconds
		FROM host_rollups WHERE host = 'gpu-node.2' AND window_start = ?`, base.Add(2*time.Second)).Scan(&memAvg, &readAvg, &readMax, &rxAvg, &txMax, &diskSec); err != nil {
		t.Fatal(err)
	}
	if memAvg != 1<<30+2.5*1024 || readAvg != (2001+3001)/2.0 || readMax != 3001 || rxAvg != 5002.5 || txMax != 100 || diskSec != 2 {
		t.Fatalf("window 2 of gpu-node.2: mem %v read %v/%v rx %v tx max %v seconds %v", memAvg, readAvg, readMax, rxAvg, txMax, diskSec)
	}
	msg, err := dead.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal("no dead letter for the invalid host sample")
	}
	if !strings.Contains(string(msg.Data), "mem_used_bytes") {
		t.Fatalf("dead letter %s", msg.Data)
	}

	// Published after they were stored: one message per row, each valid JSON of the row.
	deadline := time.Now().Add(10 * time.Second)
	var rollups []events.HostRollup
	for {
		rollups = rollups[:0]
		for _, m := range b.rollupsStream(t) {
			if !strings.HasPrefix(m.subject, "rollup.host.") {
				continue
			}
			var r events.HostRollup
			if err := json.Unmarshal(m.data, &r); err != nil {
				t.Fatal(err)
			}
			if m.subject != events.HostRollupSubject(r.Host) {
				t.Fatalf("rollup of %s on %s", r.Host, m.subject)
			}
			rollups = append(rollups, r)
		}
		if len(rollups) >= 10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(rollups) != 10 {
		t.Fatalf("%d host rollups published, want 10", len(rollups))
	}
	var sum uint64
	for _, r := range rollups {
		sum += r.Samples
	}
	if sum != 20 {
		t.Fatalf("published rollups hold %d samples, want 20", sum)
	}
}

// TestHostCrashExactlyOnce SIGKILLs the aggregator process at random points while host
// samples arrive, restarting it each time: the host_rollups add up to the samples exactly,
// every one counted once, with plain sum().
func TestHostCrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("kills the aggregator repeatedly")
	}
	b := newBed(t)
	bin := buildBinary(t)
	base := time.Now().UTC().Add(-2 * time.Minute).Truncate(2 * time.Second)
	hosts := make([]string, 8)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("gpu-node-%d", i)
	}
	samples := hostSamples(hosts, base, 60) // 30 windows × 8 hosts
	vars := b.env(envVars{"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "50ms", "AGG_LOG_LEVEL": "warn"})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := 0; i < len(samples); i += 16 {
			b.publishHost(t, samples[i:min(i+16, len(samples))])
			time.Sleep(100 * time.Millisecond)
		}
	}()
	killWhilePublishing(t, bin, vars, published, 3, 400*time.Millisecond, 800*time.Millisecond, 7)
	b.waitRows(t, time.Minute, uint64(len(samples)), "SELECT sum(samples) FROM host_rollups")
	time.Sleep(time.Second)
	checkHostTotals(t, b.hostTotals(t), wantHost(samples))
}
