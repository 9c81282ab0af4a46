package testbed

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS starts an in-process nats-server with JetStream on a free port and a temporary store,
// stopped when the test ends, and returns it; its ClientURL is what services dial.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	return StartNATS(t, t.TempDir(), -1)
}

// StartNATS starts a nats-server with JetStream storing in dir on port (-1 for a free one),
// so a test can stop it and start another on the same store and port to test a restart.
func StartNATS(t testing.TB, dir string, port int) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  dir,
		NoLog:     true,
		NoSigs:    true,
		// Generous limits: tests publish bursts of tens of thousands of messages.
		MaxPayload: 8 << 20,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("cannot create nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		t.Fatalf("nats-server did not become ready in 15s")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// JetStream starts an in-process nats-server as NATS does and returns a connection to it and
// its JetStream context; the connection closes when the test ends.
func JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(NATS(t).ClientURL())
	if err != nil {
		t.Fatalf("cannot connect to nats-server: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("cannot open JetStream: %v", err)
	}
	return nc, js
}
