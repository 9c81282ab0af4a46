package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestHolderTakesBackItsLease: a holder paused past its fence (Keep not served, as under
// SIGSTOP) loses the lease; when no other process took it meanwhile, Acquire takes it back,
// no sooner than a TTL after its last renewal (when a waiter could have taken it over), with
// a new Held; the lost term's Held stays ended, and the lease is renewed again.
func TestHolderTakesBackItsLease(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 1500 * time.Millisecond
	a, _ := open(t, url, "agg", ttl)
	taken := time.Now()
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl * 3 / 4) // past the fence, two thirds of the TTL
	if err := a.Keep(t.Context()); !errors.Is(err, ErrLost) {
		t.Fatalf("Keep after a pause past the fence = %v, want ErrLost", err)
	}
	old := a.Held()
	if old.Err() == nil {
		t.Fatal("Held has not ended")
	}
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(taken); d < ttl {
		t.Fatalf("took its lease back %s after its last renewal, before a waiter could have (%s)", d, ttl)
	}
	if old.Err() == nil {
		t.Fatal("the lost term's Held lives again: its writes would go on")
	}
	if a.Held().Err() != nil || a.Check(t.Context()) != nil {
		t.Fatalf("taken back, but Held = %v, Check = %v", a.Held().Err(), a.Check(t.Context()))
	}
	ctx, cancel := context.WithTimeout(t.Context(), ttl*2)
	defer cancel()
	if err := a.Keep(ctx); err != nil {
		t.Fatalf("Keep after taking the lease back = %v", err)
	}
	if a.Held().Err() != nil {
		t.Fatal("the lease taken back was not renewed")
	}
	if e, err := a.kv.Get(t.Context(), "agg"); err != nil || string(e.Value()) != string(a.value) {
		t.Fatalf("the lease holds %v (%v), want this process", e, err)
	}
}

// TestLostHolderStandsBy: a holder that lost its lease to another process stands by in
// Acquire (ready, as any waiter) and takes the lease only once the other releases it.
func TestLostHolderStandsBy(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = time.Second
	a, _ := open(t, url, "agg", ttl)
	b, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	select { // a does not renew: b takes over a TTL after its first read
	case <-acquired(t.Context(), b):
	case <-time.After(5 * ttl):
		t.Fatal("the waiter did not take over")
	}
	bctx, stopB := context.WithCancel(t.Context())
	bDone := make(chan error, 1)
	go func() { bDone <- b.Keep(bctx) }()
	if err := a.Keep(t.Context()); !errors.Is(err, ErrLost) {
		t.Fatalf("Keep of the holder taken over = %v, want ErrLost", err)
	}
	got := acquired(t.Context(), a)
	select {
	case <-got:
		t.Fatal("the lost holder took the lease another process holds")
	case <-time.After(3 * ttl):
	}
	if err := a.Check(t.Context()); err != nil {
		t.Fatalf("Check of the process standing by = %v, want ready", err)
	}
	stopB()
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if err := b.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(3 * ttl):
		t.Fatal("the process standing by did not take the released lease")
	}
	if a.Held().Err() != nil {
		t.Fatal("taken, but Held has ended")
	}
}
