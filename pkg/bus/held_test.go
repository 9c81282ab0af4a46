package bus_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// BenchmarkHeldAcks measures what holding acknowledgements costs nats-server: a durable
// AckAll consumer of LLM_EVENTS (file storage, as in production) reads 10,000 events/s for
// five seconds while `held` delivered messages stay unacknowledged, acknowledging
// cumulatively behind them, as the aggregator did before it kept a replay floor. held=450000
// is 10k events/s held for the default 15 s window and 30 s lateness. The figure is the CPU
// time of this process (nats-server and the consumer) per message read. For each held
// message nats-server keeps a pending entry and re-encodes the whole set ~10 times a second
// into the consumer's state file. Run it with -benchtime=1x.
// held=0 reads with an AckNone consumer, which nothing is held for: what the aggregator does
// since it keeps its replay floor in a key-value bucket instead.
func BenchmarkHeldAcks(b *testing.B) {
	for _, held := range []int{0, 1_000, 100_000, 450_000} {
		b.Run(fmt.Sprintf("held=%d", held), func(b *testing.B) { heldAcks(b, held) })
	}
}

func heldAcks(b *testing.B, held int) {
	const rate, seconds = 10_000, 5
	_, js := testbed.JetStream(b)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{}, events.StreamEvents); err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"v":1,"event_id":"0123456789abcdef0123456789abcdef","ts":"2026-03-01T11:59:00.000Z","model":"llama-3-70b","scene":"chat","env":"prod","input_tokens":1024,"output_tokens":128,"ttft_ms":210.5,"total_ms":3300.25,"status":"ok","stream":true}`)
	total := held + rate*(seconds+1)
	for i := range total {
		if _, err := js.PublishAsync("llm.req.prod.chat", payload); err != nil {
			b.Fatal(err)
		}
		if i%10_000 == 9_999 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	cc := jetstream.ConsumerConfig{Durable: "held", AckPolicy: jetstream.AckAllPolicy, MaxAckPending: -1, AckWait: time.Hour}
	if held == 0 {
		cc = jetstream.ConsumerConfig{Durable: "held", AckPolicy: jetstream.AckNonePolicy}
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvents, cc)
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(1000))
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	window := make([]jetstream.Msg, 0, held+rate*seconds)
	next := func() {
		m, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		window = append(window, m)
	}
	for range held {
		next()
	}
	time.Sleep(time.Second) // the state written for the first deliveries is not counted
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	read := 0
	cpu0 := processCPU(b)
	start := time.Now()
	for b.Loop() {
		for time.Since(start) < seconds*time.Second {
			<-tick.C
			for range rate / 1000 {
				next()
				read++
			}
			if k := len(window) - held - 1; k >= 0 && held > 0 {
				if err := window[k].Ack(); err != nil {
					b.Fatal(err)
				}
				window = window[k+1:]
			}
		}
	}
	elapsed, cpu := time.Since(start), processCPU(b)-cpu0
	info, err := cons.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// Held, plus what the client has pulled but not yet read (up to its buffer of 1,000).
	if got := info.NumAckPending; held > 0 && (got < held || got > held+1000+rate/100) {
		b.Fatalf("%d messages held, want %d", got, held)
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(read), "cpu_us/msg")
	b.ReportMetric(100*cpu.Seconds()/elapsed.Seconds(), "%_of_a_core")
}

// processCPU is this process's CPU time so far, user and system.
func processCPU(b *testing.B) time.Duration {
	d, ok := testbed.ProcessCPU(os.Getpid())
	if !ok {
		b.Skip("no /proc: the figure needs Linux")
	}
	return d
}
