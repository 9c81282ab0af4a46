package lease

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// open returns a lease of consumer over a connection of its own to url, so that a test can
// cut one process off.
func open(t *testing.T, url, consumer string, ttl time.Duration) (*Lease, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	l, err := Open(t.Context(), js, consumer, ttl, 1, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return l, nc
}

// acquired runs l.Acquire in the background and returns a channel that gets when it returned.
func acquired(ctx context.Context, l *Lease) <-chan time.Time {
	c := make(chan time.Time, 1)
	go func() {
		if l.Acquire(ctx) == nil {
			c <- time.Now()
		}
	}()
	return c
}

func TestWaiterTakesOverAtRelease(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	a, _ := open(t, url, "agg", 15*time.Second)
	b, _ := open(t, url, "agg", 15*time.Second)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	keepDone := make(chan error, 1)
	keepCtx, stopKeep := context.WithCancel(t.Context())
	go func() { keepDone <- a.Keep(keepCtx) }()
	got := acquired(t.Context(), b)
	time.Sleep(time.Second)
	select {
	case <-got:
		t.Fatal("the second process took a lease that is held")
	default:
	}
	// It says who holds it.
	b.mu.Lock()
	holder := b.holder
	b.mu.Unlock()
	if holder != a.Me() {
		t.Fatalf("the waiter sees %+v holding the lease, want %+v", holder, a.Me())
	}
	// It stands by ready, so that a rolling update goes on to stop the holder.
	if err := b.Check(t.Context()); err != nil {
		t.Fatalf("Check while waiting = %v", err)
	}
	if a.Check(t.Context()) != nil {
		t.Fatalf("the holder is not ready: %v", a.Check(t.Context()))
	}
	stopKeep()
	if err := <-keepDone; err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-got:
		if d := at.Sub(released); d > 2*time.Second {
			t.Fatalf("took over %s after the release", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter did not take the released lease")
	}
	if b.Check(t.Context()) != nil {
		t.Fatalf("the new holder is not ready: %v", b.Check(t.Context()))
	}
}

func TestWaiterTakesOverAfterTTL(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 2 * time.Second
	a, _ := open(t, url, "agg", ttl)
	b, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	took := time.Now() // a holder that dies at once: never renewed, never released
	select {
	case at := <-acquired(t.Context(), b):
		if d := at.Sub(took); d < ttl || d > ttl+2*time.Second {
			t.Fatalf("took over %s after the holder's last write, want the TTL (%s) to a second more", d, ttl)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never took a lease left stale")
	}
}

// TestHolderFencedBeforeTakeover cuts the holder off NATS: it stops (Held ends) before
// the waiter takes over, by a third of the TTL at least.
func TestHolderFencedBeforeTakeover(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 3 * time.Second
	a, anc := open(t, url, "agg", ttl)
	b, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	keepDone := make(chan error, 1)
	go func() { keepDone <- a.Keep(t.Context()) }()
	got := acquired(t.Context(), b)
	time.Sleep(2 * ttl) // renewed all along: the waiter waits
	select {
	case <-got:
		t.Fatal("the waiter took a lease that is renewed")
	default:
	}
	anc.Close()
	var fenced time.Time
	select {
	case <-a.Held().Done():
		fenced = time.Now()
	case <-time.After(2 * ttl):
		t.Fatal("the holder cut off NATS kept counting")
	}
	if err := <-keepDone; !errors.Is(err, ErrLost) {
		t.Fatalf("Keep = %v, want ErrLost", err)
	}
	if !errors.Is(context.Cause(a.Held()), ErrLost) || a.Check(t.Context()) == nil {
		t.Fatalf("Held's cause %v, Check %v", context.Cause(a.Held()), a.Check(t.Context()))
	}
	select {
	case at := <-got:
		if d := at.Sub(fenced); d < ttl/3-100*time.Millisecond {
			t.Fatalf("the waiter took over %s after the holder stopped, want a third of the TTL at least", d)
		}
	case <-time.After(3 * ttl):
		t.Fatal("the waiter never took over")
	}
}

// TestHolderLosesLeaseTakenByAnother: a lease overwritten (a process that took it by hand)
// ends the holder's at its next renewal.
func TestHolderLosesLeaseTakenByAnother(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	a, nc := open(t, url, "agg", 5*time.Second)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	keepDone := make(chan error, 1)
	go func() { keepDone <- a.Keep(t.Context()) }()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := json.Marshal(Holder{ID: "other", Host: "elsewhere", PID: 7, Started: time.Now(), TTL: "5s"})
	if _, err := kv.Put(t.Context(), "agg", other); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-keepDone:
		if !errors.Is(err, ErrLost) || !strings.Contains(err.Error(), "elsewhere pid 7") {
			t.Fatalf("Keep = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the holder did not see the lease taken")
	}
	if a.Held().Err() == nil {
		t.Fatal("Held did not end")
	}
	// Release leaves another's lease alone.
	if err := a.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(t.Context(), "agg"); err != nil || string(e.Value()) != string(other) {
		t.Fatalf("the other's lease: %v", err)
	}
}

func TestAcquireRefusesAnInvalidName(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	a, _ := open(t, url, "a:b", 5*time.Second)
	if err := a.Acquire(t.Context()); err == nil || !strings.Contains(err.Error(), `AGG_CONSUMER="a:b"`) {
		t.Fatalf("Acquire = %v", err)
	}
}
