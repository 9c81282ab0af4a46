package bus_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestPublisherSurvivesNATSRestart publishes while NATS is down: nothing blocks, the buffer
// holds what fits, the overflow is counted, and everything buffered lands once NATS is back
// (including duplicates dropped by Nats-Msg-Id).
func TestPublisherSurvivesNATSRestart(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	url := srv.ClientURL()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 64 << 20, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p := bus.NewPublisher(js, bus.PublisherOptions{Buffer: 100, Batch: 16, AckTimeout: 200 * time.Millisecond, Namespace: "t"}, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()

	for i := range 10 {
		p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`))
	}
	waitFor(t, func() bool { return metric(reg, "t_published_total") == 10 })

	// NATS goes away; a new server on the same port and store comes back later.
	srv.Shutdown()
	srv.WaitForShutdown()
	start := time.Now()
	accepted := 0
	for i := 10; i < 300; i++ {
		if p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`)) {
			accepted++
		}
	}
	dupAccepted := p.Publish("llm.req.prod.chat", "id-3", []byte(`{}`)) // a retry of an already stored event
	if time.Since(start) > time.Second {
		t.Fatalf("Publish blocked for %s while NATS was down", time.Since(start))
	}
	if accepted < 100 || accepted > 100+2*16 { // the buffer, plus the batches Run holds in hand
		t.Fatalf("accepted %d while NATS was down with a buffer of 100", accepted)
	}
	testbed.StartNATS(t, filepath.Join(dir, "js"), port)
	waitFor(t, func() bool {
		return metric(reg, "t_published_total") == float64(10+accepted)
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, events.StreamEvents)
	info, _ := s.Info(ctx)
	if info.State.Msgs != uint64(10+accepted) {
		t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, 10+accepted)
	}
	wantDropped, wantDup := 291-accepted, 0.0
	if dupAccepted {
		wantDropped, wantDup = 290-accepted, 1
	}
	if d := metric(reg, "t_publish_dropped_total"); int(d) != wantDropped {
		t.Fatalf("dropped %v, want %d", d, wantDropped)
	}
	if d := metric(reg, "t_published_duplicate_total"); d != wantDup {
		t.Fatalf("duplicates %v, want %v", d, wantDup)
	}
}

func metric(reg *prometheus.Registry, name string) float64 {
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name {
			if m := mf.GetMetric()[0]; m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return -1
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestPublisherAcks checks how acks are read: duplicates counted apart, a subject no stream
// takes refused and retried until one does, a message refused for good dropped, and a
// Publish after Run returned dropped.
func TestPublisherAcks(t *testing.T) {
	srv := testbed.NATS(t)
	ctx := t.Context()
	p, js, reg, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 100, Batch: 4, AckTimeout: time.Second})
	limits := bus.StreamLimits{MaxBytes: 64 << 20, DuplicateWindow: time.Minute, Replicas: 1}

	for i := range 10 {
		p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`))
	}
	for i := range 3 {
		p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`))
	}
	waitFor(t, func() bool {
		return metric(reg, "t_published_total") == 10 && metric(reg, "t_published_duplicate_total") == 3
	})

	p.Publish("gpu.sample.host-1", "gpu-1", []byte(`{}`))
	waitFor(t, func() bool { return metric(reg, "t_publish_retried_total") >= 2 })
	if p.Buffered() != 1 || metric(reg, "t_published_total") != 10 {
		t.Fatalf("buffered %d published %v while no stream takes the subject", p.Buffered(), metric(reg, "t_published_total"))
	}
	if err := bus.EnsureStreams(ctx, js, limits, events.StreamGPU); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return metric(reg, "t_published_total") == 11 })

	// A message the stream refuses for good (over its size limit) is dropped and counted,
	// and holds up nothing behind it.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 64}); err != nil {
		t.Fatal(err)
	}
	p.Publish("small.a", "big", make([]byte, 100))
	p.Publish("small.a", "fits", []byte(`{}`))
	waitFor(t, func() bool {
		return metric(reg, "t_published_total") == 12 && metric(reg, "t_publish_dropped_total") == 1
	})

	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if p.Publish("llm.req.prod.chat", "late", []byte(`{}`)) || metric(reg, "t_publish_dropped_total") != 2 {
		t.Fatalf("a Publish after Run returned was not dropped and counted")
	}
}

// TestPublisherGivesUpAtShutdown stops the publisher while NATS is away: Run keeps trying
// for FlushTimeout, then returns an error and counts what it held as dropped.
func TestPublisherGivesUpAtShutdown(t *testing.T) {
	srv := testbed.NATS(t)
	p, _, reg, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 100, Batch: 4, AckTimeout: 200 * time.Millisecond, FlushTimeout: 300 * time.Millisecond},
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	srv.Shutdown()
	srv.WaitForShutdown()
	for i := range 7 {
		if !p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`)) {
			t.Fatal("buffer full")
		}
	}
	if err := stop(); err == nil || !strings.Contains(err.Error(), "7 messages unpublished") {
		t.Fatalf("Run returned %v", err)
	}
	if d := metric(reg, "t_publish_dropped_total"); d != 7 || p.Buffered() != 0 {
		t.Fatalf("dropped %v, buffered %d", d, p.Buffered())
	}
}

// TestPublisherLinger: with Linger, the first message into an empty queue waits that long
// for others, and they go together; a shutdown during the wait publishes them at once.
func TestPublisherLinger(t *testing.T) {
	srv := testbed.NATS(t)
	const linger = 300 * time.Millisecond
	p, _, reg, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 100, Linger: linger})

	start := time.Now()
	for i := range 5 {
		p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`))
	}
	waitFor(t, func() bool { return metric(reg, "t_published_total") == 5 })
	if took := time.Since(start); took < linger {
		t.Fatalf("published after %s, before the linger of %s", took, linger)
	}

	// Stopped while lingering: nothing waits for the timer, nothing is lost.
	p.Publish("llm.req.prod.chat", "id-last", []byte(`{}`))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := metric(reg, "t_published_total"); got != 6 {
		t.Fatalf("%v published, want 6", got)
	}
}

// startPublisher connects to the NATS at url, makes sure LLM_EVENTS exists, and runs a
// publisher with opts under the metric namespace "t". stop ends Run and returns its error.
func startPublisher(t *testing.T, url string, opts bus.PublisherOptions, natsOpts ...nats.Option) (p *bus.Publisher, js jetstream.JetStream, reg *prometheus.Registry, stop func() error) {
	t.Helper()
	nc, err := nats.Connect(url, natsOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ = jetstream.New(nc)
	if err := bus.EnsureStreams(t.Context(), js, bus.StreamLimits{MaxBytes: 64 << 20, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	opts.Namespace = "t"
	p = bus.NewPublisher(js, opts, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	return p, js, reg, func() error { cancel(); return <-done }
}

// TestPublisherBufferBytes: while NATS is away the buffer takes messages until their bytes
// reach BufferBytes, however few they are, and drops and counts the rest; once NATS takes
// what was held its bytes are free again.
func TestPublisherBufferBytes(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	p, js, reg, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 1000, BufferBytes: 10_000, Batch: 4, AckTimeout: 200 * time.Millisecond},
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	defer func() { _ = stop() }()
	if err := bus.EnsureStreams(t.Context(), js, bus.StreamLimits{MaxBytes: 64 << 20, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	srv.WaitForShutdown()

	data := make([]byte, 3000)
	took := 0
	for i := range 5 {
		if p.Publish("llm.req.prod.chat", fmt.Sprint("id-", i), data) {
			took++
		}
	}
	// Each message holds 3,000 bytes of data, 17 of subject and 4 of id: three fit in 10,000.
	if took != 3 || p.BufferedBytes() != 3*3021 || metric(reg, "t_publish_dropped_total") != 2 {
		t.Fatalf("took %d, holding %d bytes, dropped %v", took, p.BufferedBytes(), metric(reg, "t_publish_dropped_total"))
	}
	if metric(reg, "t_publish_buffered_bytes") != 3*3021 {
		t.Fatalf("publish_buffered_bytes %v", metric(reg, "t_publish_buffered_bytes"))
	}

	testbed.StartNATS(t, filepath.Join(dir, "js"), port)
	waitFor(t, func() bool { return metric(reg, "t_published_total") == 3 })
	waitFor(t, func() bool { return p.BufferedBytes() == 0 && p.Buffered() == 0 })
	if !p.Publish("llm.req.prod.chat", "id-after", data) {
		t.Fatal("the buffer's bytes were not freed once NATS took the messages")
	}
}
