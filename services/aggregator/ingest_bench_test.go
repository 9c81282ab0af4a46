package main

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// BenchmarkIngest measures, in one run on the same stream, the raw JetStream consume rate
// (a pull consumer acknowledging cumulatively every 500 messages, doing nothing else) and the
// aggregator's ingest rate (decode, validate, windows, requests and rollups written to
// ClickHouse, the replay floor saved). The goal is aggregator ≥ 70 % of raw. Both rates are
// taken from the tenth event to the last. It reads the Azure conversation trace
// (testbed.Trace) and skips without it.
//
//	go test -run '^$' -bench Ingest -benchtime 1x .
//	INGEST_STORE_REQUESTS=false go test -run '^$' -bench Ingest -benchtime 1x .   # AGG_STORE_REQUESTS=false: rollups only
//
// INGEST_RAW_ACK_EVERY changes how often the raw consumer acknowledges (500), to compare with
// the aggregator's acknowledgement pattern; INGEST_FLUSH_INTERVAL and INGEST_PULL_BATCH set
// AGG_FLUSH_INTERVAL and AGG_PULL_BATCH; INGEST_PROFILE and INGEST_RAW_PROFILE write CPU
// profiles of the aggregator's phase and of the raw consumer's.
func BenchmarkIngest(b *testing.B) {
	const n = 200_000
	rows := readTrace(b, 20_000)
	bd := newBed(b)
	base := time.Now().UTC().Add(-10 * time.Minute).Truncate(15 * time.Second)
	var evs []events.RequestEvent
	for len(evs) < n {
		evs = append(evs, buildEvents(rows, base, uint64(len(evs)))...)
	}
	evs = evs[:n]
	for i := range evs {
		evs[i].TS = base.Add(time.Duration(i) * time.Millisecond)
	}
	// Events are published when requests end, as the emitter does.
	slices.SortFunc(evs, func(a, b events.RequestEvent) int {
		return a.TS.Add(time.Duration(a.TotalMs * 1e6)).Compare(b.TS.Add(time.Duration(b.TotalMs * 1e6)))
	})
	bd.publish(b, evs)
	ctx := context.Background()
	for b.Loop() {
		// Raw consume.
		cons, err := bd.js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{Durable: "raw", AckPolicy: jetstream.AckAllPolicy, MaxAckPending: -1})
		if err != nil {
			b.Fatal(err)
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(10_000))
		if err != nil {
			b.Fatal(err)
		}
		rawAckEvery, _ := strconv.Atoi(envOr("INGEST_RAW_ACK_EVERY", "500"))
		stopRawProfile := startProfile(b, os.Getenv("INGEST_RAW_PROFILE"))
		var from time.Time
		var rawCPU0 time.Duration
		for i := range n {
			m, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			if i == n/10 {
				from, rawCPU0 = time.Now(), selfCPU()
			}
			if (i+1)%rawAckEvery == 0 || i == n-1 {
				m.Ack()
			}
		}
		raw := float64(n-n/10) / time.Since(from).Seconds()
		rawCPU := selfCPU() - rawCPU0
		it.Stop()
		stopRawProfile()

		// The aggregator, from the same stream.
		addr := freeAddr(b)
		defer startProfile(b, os.Getenv("INGEST_PROFILE"))()
		chSrv := testbed.Server(b)
		chCPU0, _ := chSrv.CPU()
		stop := startAggregator(b, bd.env(envVars{"HTTP_ADDR": addr, "AGG_LOG_LEVEL": "warn", "AGG_STORE_REQUESTS": storeRequests(), "AGG_FLUSH_INTERVAL": flushInterval(), "AGG_PULL_BATCH": envOr("INGEST_PULL_BATCH", "10000")}))
		// Timed like the raw consumer: from the tenth of the events to the last, so that
		// neither start-up (connecting, migrations, the ledger) nor the first pull counts.
		deadline := time.Now().Add(5 * time.Minute)
		from, fromCount := time.Time{}, 0
		var aggCPU0, chCPUFrom time.Duration
		for {
			got := addedEvents(addr)
			if from.IsZero() && got >= n/10 {
				from, fromCount = time.Now(), got
				aggCPU0 = selfCPU()
				chCPUFrom, _ = chSrv.CPU()
			}
			if got >= n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the aggregator did not take every event in 5 minutes")
			}
			// Each poll renders every metric in the process being measured: poll often only
			// near the two instants timed.
			if !from.IsZero() && got < n*9/10 {
				time.Sleep(50 * time.Millisecond)
			} else {
				time.Sleep(5 * time.Millisecond)
			}
		}
		agg := float64(n-fromCount) / time.Since(from).Seconds()
		aggCPU := selfCPU() - aggCPU0
		chCPU1, _ := chSrv.CPU()
		chCPU := chCPU1 - chCPU0
		perEvent := func(d time.Duration, events int) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(events) }
		stop()
		b.ReportMetric(raw, "raw_msgs/s")
		b.ReportMetric(agg, "aggregator_msgs/s")
		b.ReportMetric(100*agg/raw, "%_of_raw")
		b.ReportMetric(chCPU.Seconds(), "clickhouse_cpu_s")
		// CPU per event in the timed spans: this process (nats-server and the raw consumer, or
		// nats-server and the aggregator) and the ClickHouse server. Two cores bound their sum.
		b.ReportMetric(perEvent(rawCPU, n-n/10), "raw_cpu_us/msg")
		b.ReportMetric(perEvent(aggCPU, n-fromCount), "agg_cpu_us/msg")
		b.ReportMetric(perEvent(chCPU1-chCPUFrom, n-fromCount), "ch_cpu_us/msg")
	}
}

// selfCPU is this process's CPU time so far, user and system.
func selfCPU() time.Duration {
	d, _ := testbed.ProcessCPU(os.Getpid())
	return d
}

// startProfile writes a CPU profile to file (when named) until the returned function is called.
func startProfile(b *testing.B, file string) (stop func()) {
	if file == "" {
		return func() {}
	}
	out, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		b.Fatal(err)
	}
	return func() { pprof.StopCPUProfile(); out.Close() }
}

// storeRequests is AGG_STORE_REQUESTS for the benchmark: INGEST_STORE_REQUESTS=false
// measures the rollups alone.
func storeRequests() string {
	if v := os.Getenv("INGEST_STORE_REQUESTS"); v != "" {
		return v
	}
	return "true"
}

func flushInterval() string { return envOr("INGEST_FLUSH_INTERVAL", "1s") }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func freeAddr(b testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metricValue sums the samples of one metric (every label set matching the filter) from
// /metrics.
func metricValue(addr, name, filter string) float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, filter) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return total
}

// metricsClient polls /metrics uncompressed: gzip on every poll would cost the aggregator
// CPU the benchmark is measuring.
var metricsClient = &http.Client{Transport: &http.Transport{DisableCompression: true}}

// addedEvents reads aggregator_events_total{stream="tokens"} (every result) from /metrics.
func addedEvents(addr string) int {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	total := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "aggregator_events_total{") && strings.Contains(line, `stream="tokens"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += int(v)
		}
	}
	return total
}
