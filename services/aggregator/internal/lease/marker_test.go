package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestRemovedLeaseWaitsForTheHolderTTL: a process started after the lease was deleted or
// purged (`nats kv del`, `nats kv purge`) finds the marker, and the TTL of the holder only
// behind a delete's (a purge leaves none); the holder counts until its next renewal, a fifth
// of its own TTL away. A waiter with a shorter
// TTL (a rolling update that lowers AGG_LEASE_TTL) must not take the lease before the holder
// has stopped.
func TestRemovedLeaseWaitsForTheHolderTTL(t *testing.T) {
	for _, c := range []struct {
		name   string
		remove func(ctx context.Context, kv jetstream.KeyValue) error
	}{
		{"delete", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "agg") }},
		{"purge", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Purge(ctx, "agg") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := testbed.NATS(t).ClientURL()
			a, nc := open(t, url, "agg", 10*time.Second) // renews every 2 s
			if err := a.Acquire(t.Context()); err != nil {
				t.Fatal(err)
			}
			kv, w := watchLease(t, nc)
			keepDone := make(chan error, 1)
			go func() { keepDone <- a.Keep(t.Context()) }()
			<-w.Updates() // a renewal: the next is 2 s away
			if err := c.remove(t.Context(), kv); err != nil {
				t.Fatal(err)
			}
			b, _ := open(t, url, "agg", time.Second)
			got := acquired(t.Context(), b)
			select {
			case <-got:
				if a.Held().Err() == nil {
					t.Fatal("a process started after the lease was removed took it while its holder still counts")
				}
			case err := <-keepDone:
				if !errors.Is(err, ErrLost) {
					t.Fatalf("Keep = %v, want ErrLost", err)
				}
				select {
				case <-got:
					t.Fatal("the waiter took the lease as its holder stopped")
				default:
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the holder never found its lease removed")
			}
		})
	}
}

// TestDeletedLeaseWaitsTheTTLInHistory: the bucket keeps the value before a delete marker, so
// a process started after the deletion (`nats kv del`) waits the holder's TTL read there, not
// the longest; so too in a bucket an earlier version made with a history of 1, which Open
// updates.
func TestDeletedLeaseWaitsTheTTLInHistory(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: Bucket, History: 1, Storage: jetstream.FileStorage, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 4 * time.Second
	a, _ := open(t, url, "agg", ttl)
	if st, err := kv.Status(t.Context()); err != nil || st.History() != 2 {
		t.Fatalf("the bucket keeps a history of %d (%v), want 2", st.History(), err)
	}
	b, _ := open(t, url, "agg", time.Second)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(t.Context(), "agg"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	select {
	case at := <-acquired(t.Context(), b):
		if d := at.Sub(deleted); d < ttl || d > ttl+2*time.Second {
			t.Fatalf("took the deleted lease %s after the deletion, want the holder's TTL (%s) to 2 s more", d, ttl)
		}
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("the waiter did not take the deleted lease after the holder's TTL")
	}
}

// TestAbandonLeavesTheLease: a process that stops with a write unsettled leaves the lease as
// it is (the next process waits the TTL), and no longer says it holds it.
func TestAbandonLeavesTheLease(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	a, _ := open(t, url, "agg", 10*time.Second)
	reg := prometheus.NewRegistry()
	reg.MustRegister(a.held)
	held := func() float64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gather: %v, %d families", err, len(mfs))
		}
		return mfs[0].GetMetric()[0].GetGauge().GetValue()
	}
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v := held(); v != 1 {
		t.Fatalf("aggregator_lease_held = %v once taken, want 1", v)
	}
	before, err := a.kv.Get(t.Context(), "agg")
	if err != nil {
		t.Fatal(err)
	}
	a.Abandon()
	if v := held(); v != 0 {
		t.Fatalf("aggregator_lease_held = %v after Abandon, want 0", v)
	}
	if a.Held().Err() == nil {
		t.Fatal("Held has not ended")
	}
	if a.Check(t.Context()) == nil {
		t.Fatal("Check passes once the lease is abandoned")
	}
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	after, err := a.kv.Get(t.Context(), "agg")
	if err != nil {
		t.Fatal(err)
	}
	if after.Revision() != before.Revision() {
		t.Fatalf("the lease was written after Abandon: revision %d, then %d", before.Revision(), after.Revision())
	}
}
