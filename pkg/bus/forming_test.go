package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestEnsureWaitsForFormingCluster starts a service's setup on a NATS cluster that cannot yet
// place three replicas, as when a deploy starts the services with their NATS cluster:
// EnsureStreams and EnsureKeyValue retry until the third server joins, and the stream and
// bucket get their three replicas.
func TestEnsureWaitsForFormingCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node NATS cluster")
	}
	tests := []struct {
		name string
		// first2 has the first two servers route to each other only: they form a cluster of
		// two, with a meta leader, that cannot place three replicas ("no suitable peers for
		// placement") until the third joins. Otherwise the two wait for the third of the
		// routes to elect a meta leader ("JetStream system temporarily unavailable").
		first2 bool
	}{
		{"a meta leader with two peers", true},
		{"no meta leader yet", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testbed.NATSClusterOptions(t, 3)
			if tt.first2 {
				opts[0].Routes, opts[1].Routes = opts[0].Routes[:2], opts[1].Routes[:2]
			}
			servers := []*server.Server{testbed.StartNATSServer(t, opts[0]), testbed.StartNATSServer(t, opts[1])}
			if tt.first2 {
				testbed.WaitNATSCluster(t, servers)
			}
			nc, err := nats.Connect(servers[0].ClientURL() + "," + servers[1].ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*bus.FormingPatience)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 20, DuplicateWindow: time.Minute, Replicas: 3}, events.StreamEvents)
				if err == nil {
					_, err = bus.EnsureKeyValue(ctx, js, "forming", "a bucket made while the cluster forms", 3)
				}
				done <- err
			}()
			// The third server comes a moment later; until then nothing can be placed.
			select {
			case err := <-done:
				t.Fatalf("ensured on 2 of 3 servers: %v", err)
			case <-time.After(time.Second):
			}
			servers = append(servers, testbed.StartNATSServer(t, opts[2]))
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			s, err := js.Stream(ctx, events.StreamEvents)
			if err != nil {
				t.Fatal(err)
			}
			if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				t.Fatalf("stream %s: %d replicas configured, cluster %+v", events.StreamEvents, info.Config.Replicas, info.Cluster)
			}
			testbed.WaitStreamCurrent(t, servers, "$G", events.StreamEvents, 3)
			kv, err := js.KeyValue(ctx, "forming")
			if err != nil {
				t.Fatal(err)
			}
			if st, err := kv.Status(ctx); err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
				t.Fatalf("bucket: %v %+v", err, st)
			}
		})
	}
}
