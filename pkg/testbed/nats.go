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
// loopback, each storing in a temporary folder, and waits until the cluster is ready
// (WaitNATSCluster). They are stopped when the test ends (a test may shut one down earlier).
func NATSCluster(t testing.TB, n int) []*server.Server {
	t.Helper()
	opts := NATSClusterOptions(t, n)
	servers := make([]*server.Server, n)
	for i, o := range opts {
		servers[i] = StartNATSServer(t, o)
	}
	WaitNATSCluster(t, servers)
	return servers
}

// NATSClusterOptions returns the options of n nats-servers with JetStream (n1, n2, …) routed
// into one cluster on loopback, each storing in a temporary folder, for a test that starts
// them itself with StartNATSServer: some later than others, to test a cluster forming.
func NATSClusterOptions(t testing.TB, n int) []*server.Options {
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
	opts := make([]*server.Options, n)
	for i := range opts {
		opts[i] = &server.Options{
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
	}
	return opts
}

// StartNATSServer starts a nats-server with opts and returns it once it takes connections;
// it is stopped when the test ends.
func StartNATSServer(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("cannot create nats-server %s: %v", opts.ServerName, err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(time.Minute) {
		t.Fatalf("nats-server %s did not become ready in a minute", opts.ServerName)
	}
	return s
}

// clusterWait bounds the waits for a cluster: generous, so that a loaded machine stays under it.
const clusterWait = 2 * time.Minute

// WaitNATSCluster waits until the running servers have one JetStream meta leader that counts
// each of them as a peer it has heard from, and each is current with the meta leader: until
// then, placing a replicated stream may fail ("no suitable peers for placement").
func WaitNATSCluster(t testing.TB, servers []*server.Server) {
	t.Helper()
	waitCluster(t, "the NATS cluster has no JetStream meta leader current with all its peers", func() bool {
		var leader *server.Server
		running := 0
		for _, s := range servers {
			if !s.Running() {
				continue
			}
			running++
			if s.JetStreamIsLeader() {
				if leader != nil {
					return false
				}
				leader = s
			}
			if !s.JetStreamIsCurrent() {
				return false
			}
		}
		return leader != nil && len(leader.JetStreamClusterPeers()) == running
	})
}

// WaitStreamCurrent waits until each running server holding a replica of the account's stream
// is current with its leader, and as many as want of them do.
func WaitStreamCurrent(t testing.TB, servers []*server.Server, account, stream string, want int) {
	t.Helper()
	waitCluster(t, fmt.Sprintf("stream %s has no %d current replicas", stream, want), func() bool {
		current := 0
		for _, s := range servers {
			if s.Running() && s.JetStreamIsStreamAssigned(account, stream) && s.JetStreamIsStreamCurrent(account, stream) {
				current++
			}
		}
		return current >= want
	})
}

func waitCluster(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(clusterWait); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s after %s", what, clusterWait)
		}
	}
}
