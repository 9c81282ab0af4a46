package bus_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// BenchmarkJetStreamCeiling measures what the in-process nats-server takes into LLM_EVENTS,
// configured as in production (file storage, duplicate window), with no emitter in the way:
// the ceiling any publisher on this machine can reach. Each iteration publishes a batch of
// 1,000 events of ~260 bytes; events/s counts until the stream holds them all. Client and
// server share the machine's cores, as they do in BenchmarkIngestNATS. Run it with
// -benchtime=200x.
func BenchmarkJetStreamCeiling(b *testing.B) {
	const batch = 1000
	payload := []byte(`{"v":1,"event_id":"0123456789abcdef0123456789abcdef","ts":"2026-03-01T11:59:00.000Z","model":"llama-3-70b","scene":"chat","env":"prod","input_tokens":1024,"output_tokens":128,"ttft_ms":210.5,"total_ms":3300.25,"status":"ok","stream":true}`)
	const subject = "llm.req.prod.chat"
	// A publishFunc publishes the batch of events first to first+999; first -1 ends the run.
	type publishFunc func(b *testing.B, nc *nats.Conn, js jetstream.JetStream, first int)
	msg := func(i int, withID bool) *nats.Msg {
		m := &nats.Msg{Subject: subject, Data: payload}
		if withID {
			m.Header = nats.Header{jetstream.MsgIDHeader: []string{"id-" + strconv.Itoa(i)}}
		}
		return m
	}
	// async publishes a batch and waits for the acks of the batch published inFlight-1
	// batches earlier: inFlight 1 is one ingest request at a time, 2 is two in parallel.
	async := func(withID bool, inFlight int) publishFunc {
		var waiting [][]jetstream.PubAckFuture
		return func(b *testing.B, _ *nats.Conn, js jetstream.JetStream, first int) {
			if first >= 0 {
				futures := make([]jetstream.PubAckFuture, batch)
				for i := range batch {
					f, err := js.PublishMsgAsync(msg(first+i, withID))
					if err != nil {
						b.Fatal(err)
					}
					futures[i] = f
				}
				waiting = append(waiting, futures)
			}
			for len(waiting) >= inFlight || (first < 0 && len(waiting) > 0) {
				for _, f := range waiting[0] {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					case <-time.After(30 * time.Second):
						b.Fatal("no ack in 30s")
					}
				}
				waiting = waiting[1:]
			}
		}
	}
	// reply publishes with a reply subject of its own and counts the acks in one
	// subscription, with at most inFlight batches unacknowledged: what JetStream costs
	// without the client library's per-message futures and JSON decoding of acks.
	reply := func(inFlight int) publishFunc {
		var conn *nats.Conn
		var sem chan struct{}
		var acked, failed atomic.Int64
		var inbox string
		sent := 0
		return func(b *testing.B, nc *nats.Conn, _ jetstream.JetStream, first int) {
			if conn != nc {
				conn, sem, inbox = nc, make(chan struct{}, inFlight*batch), nats.NewInbox()
				acked.Store(0)
				failed.Store(0)
				sent = 0
				if _, err := nc.Subscribe(inbox+".*", func(m *nats.Msg) {
					if len(m.Data) == 0 || bytes.Contains(m.Data, []byte(`"error"`)) {
						failed.Add(1)
					}
					acked.Add(1)
					<-sem
				}); err != nil {
					b.Fatal(err)
				}
			}
			if first < 0 {
				deadline := time.Now().Add(30 * time.Second)
				for acked.Load() < int64(sent) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				if acked.Load() < int64(sent) || failed.Load() > 0 {
					b.Fatalf("%d of %d acked, %d failed", acked.Load(), sent, failed.Load())
				}
				return
			}
			for i := range batch {
				m := msg(first+i, true)
				m.Reply = inbox + "." + strconv.Itoa(first+i)
				sem <- struct{}{}
				if err := nc.PublishMsg(m); err != nil {
					b.Fatal(err)
				}
				sent++
			}
		}
	}
	// publisher goes through bus.Publisher, as the emitter does.
	publisher := func() publishFunc {
		var conn *nats.Conn
		var p *bus.Publisher
		var stop context.CancelFunc
		return func(b *testing.B, nc *nats.Conn, js jetstream.JetStream, first int) {
			if conn != nc {
				conn = nc
				p = bus.NewPublisher(js, bus.PublisherOptions{Buffer: 1 << 20}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
				var ctx context.Context
				ctx, stop = context.WithCancel(context.Background())
				go func() { _ = p.Run(ctx) }()
			}
			if first < 0 {
				for p.Buffered() > 0 {
					time.Sleep(time.Millisecond)
				}
				stop()
				return
			}
			for i := range batch {
				if !p.Publish(subject, "id-"+strconv.Itoa(first+i), payload) {
					b.Fatal("buffer full")
				}
			}
		}
	}
	core := func(withID bool) publishFunc {
		return func(b *testing.B, nc *nats.Conn, _ jetstream.JetStream, first int) {
			for i := range batch * min(first+1, 1) {
				if err := nc.PublishMsg(msg(first+i, withID)); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	variants := []struct {
		name    string
		window  time.Duration
		publish publishFunc
	}{
		{"sync-msgid", 2 * time.Minute, func(b *testing.B, _ *nats.Conn, js jetstream.JetStream, first int) {
			for i := range batch * min(first+1, 1) {
				if _, err := js.PublishMsg(context.Background(), msg(first+i, true)); err != nil {
					b.Fatal(err)
				}
			}
		}},
		{"async-msgid", 2 * time.Minute, async(true, 1)},
		{"async-nomsgid", 2 * time.Minute, async(false, 1)},
		{"async-msgid-window10s", 10 * time.Second, async(true, 1)},
		{"async-msgid-inflight2", 2 * time.Minute, async(true, 2)},
		{"async-msgid-inflight4", 2 * time.Minute, async(true, 4)},
		{"reply-msgid-inflight1", 2 * time.Minute, reply(1)},
		{"reply-msgid-inflight4", 2 * time.Minute, reply(4)},
		{"publisher-msgid", 2 * time.Minute, publisher()},
		// Not for production: the server acks before it writes, so a crash of nats-server
		// loses what it acknowledged. It shows what the write per message costs.
		{"publisher-msgid-persistasync", 2 * time.Minute, publisher()},
		{"core-msgid", 2 * time.Minute, core(true)},
		{"core-nomsgid", 2 * time.Minute, core(false)},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			srv := testbed.NATS(b)
			nc, err := nats.Connect(srv.ClientURL())
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8*batch))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: v.window, Replicas: 1}, events.StreamEvents); err != nil {
				b.Fatal(err)
			}
			stream, err := js.Stream(ctx, events.StreamEvents)
			if err != nil {
				b.Fatal(err)
			}
			if strings.HasSuffix(v.name, "-persistasync") { // set only when the stream is made
				cfg := stream.CachedInfo().Config
				cfg.PersistMode = jetstream.AsyncPersistMode
				if err := js.DeleteStream(ctx, cfg.Name); err != nil {
					b.Fatal(err)
				}
				if stream, err = js.CreateStream(ctx, cfg); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			n := 0
			start, cpu0 := time.Now(), cpuTime()
			for b.Loop() {
				v.publish(b, nc, js, n*batch)
				n++
			}
			v.publish(b, nc, js, -1)
			// Core publishes get no ack: count what the stream holds, until it stops growing.
			// What never arrives was dropped by the server's ingest queue.
			var held uint64
			stored := time.Now()
			for time.Since(stored) < 500*time.Millisecond && held < uint64(n*batch) {
				info, err := stream.Info(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if info.State.Msgs != held {
					held, stored = info.State.Msgs, time.Now()
				}
				time.Sleep(5 * time.Millisecond)
			}
			b.ReportMetric(float64(held)/stored.Sub(start).Seconds(), "events/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(held), "cpu-µs/event")
			b.ReportMetric(float64(uint64(n*batch)-held), "lost")
		})
	}
}

// cpuTime is the CPU time, user and system, this process has used: the client and the
// in-process server together. Unlike events/s it hardly moves when other processes
// share the cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
