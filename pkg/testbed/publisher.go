package testbed

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

// Publisher connects to the NATS at url, makes the streams named (256 MiB each, a
// one-minute duplicate window, one replica) and runs a bus.Publisher with opts (metric
// namespace "t" unless set) until the test ends. Its client reconnects for ever, every
// 50 ms, so that a test can stop the server under it and start it again (StartNATS on the
// same store and port); js.Conn() is that client.
func Publisher(t testing.TB, url string, opts bus.PublisherOptions, streams ...string) (pub *bus.Publisher, js jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("cannot connect to %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 256 << 20, DuplicateWindow: time.Minute, Replicas: 1}, streams...); err != nil {
		t.Fatal(err)
	}
	if opts.Namespace == "" {
		opts.Namespace = "t"
	}
	pub = bus.NewPublisher(js, opts, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	return pub, js
}
