package testbed

import (
	"fmt"
	"net/url"
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

// NATSCluster starts n in-process nats-servers with JetStream, routed into one cluster on
// loopback, each storing in a temporary folder, and waits until JetStream has a meta leader.
// They are stopped when the test ends (a test may shut one down earlier).
func NATSCluster(t testing.TB, n int) []*server.Server {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			t.Fatalf("cannot find a free port: %v", err)
		}
		ports[i] = p
	}
	routes := make([]*url.URL, n)
	for i, p := range ports {
		routes[i] = &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)}
	}
	servers := make([]*server.Server, n)
	for i := range servers {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			MaxPayload: 8 << 20,
			Cluster:    server.ClusterOpts{Name: "tokenscope", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("cannot create nats-server n%d: %v", i+1, err)
		}
		go s.Start()
		servers[i] = s
		t.Cleanup(func() {
			s.Shutdown()
			s.WaitForShutdown()
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range servers {
		if !s.ReadyForConnections(15 * time.Second) {
			t.Fatalf("nats-server %s did not become ready in 15s", s.Name())
		}
	}
	for {
		leaders := 0
		for _, s := range servers {
			if s.JetStreamIsLeader() {
				leaders++
			}
		}
		if leaders == 1 {
			return servers
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %d-node NATS cluster has no JetStream meta leader after 30s", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
