package lease

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestHeldEndsAtDeadlineWhenKeepRunsLate: a process paused (a GC pause, SIGSTOP) past its
// fence resumes with every goroutine runnable at once, and a write may come before Keep's
// timer is served: Held must already say the lease is lost, by the clock, not once Keep
// has run.
func TestHeldEndsAtDeadlineWhenKeepRunsLate(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 1500 * time.Millisecond
	a, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	if a.Held().Err() != nil {
		t.Fatal("Held ended at once")
	}
	time.Sleep(ttl) // Keep not served: past the fence (two thirds of the TTL)
	if a.Held().Err() == nil {
		t.Fatal("Held has not ended a TTL after the last renewal: a write now would race the next holder")
	}
	if !errors.Is(context.Cause(a.Held()), ErrLost) {
		t.Fatalf("Held's cause = %v, want ErrLost", context.Cause(a.Held()))
	}
	select {
	case <-a.Held().Done():
	default:
		t.Fatal("Held's Err says lost but Done is open: contexts made from it still write")
	}
}

// TestDeletedLeaseNotTakenBeforeHolderStops: an operator's `nats kv del` of a held lease is
// not a release: the holder counts until its next renewal finds it gone, so a waiter must
// not take it over before the holder has stopped.
func TestDeletedLeaseNotTakenBeforeHolderStops(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 10 * time.Second
	a, nc := open(t, url, "agg", ttl)
	b, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	kv, w := watchLease(t, nc)
	keepDone := make(chan error, 1)
	go func() { keepDone <- a.Keep(t.Context()) }()
	got := acquired(t.Context(), b)
	<-w.Updates() // a renewal: the next is a fifth of the TTL away
	if err := kv.Delete(t.Context(), "agg"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
		if a.Held().Err() == nil {
			t.Fatal("the waiter took over a deleted lease while its holder still counts")
		}
	case <-time.After(3 * ttl):
		t.Fatal("the waiter never took over the deleted lease")
	}
	if err := <-keepDone; !errors.Is(err, ErrLost) {
		t.Fatalf("Keep = %v, want ErrLost", err)
	}
}

// slowKV delays each Get's request by delay while slow is set; it fails every Update once
// failing is set.
type slowKV struct {
	jetstream.KeyValue
	delay   time.Duration
	slow    atomic.Bool
	failing atomic.Bool
	onGet   func()
}

func (s *slowKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if s.slow.Load() {
		time.Sleep(s.delay)
	}
	e, err := s.KeyValue.Get(ctx, key)
	if s.onGet != nil {
		s.onGet()
	}
	return e, err
}

func (s *slowKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if s.failing.Load() {
		return 0, errors.New("no route to NATS")
	}
	return s.KeyValue.Update(ctx, key, value, rev)
}

// TestWaiterCountsFromTheRead: a waiter's Get that is slow to reach the server sees a
// renewal sent after the Get was; the TTL runs from when the revision was read, not from
// when it was asked for, or the waiter takes over while the holder still counts.
func TestWaiterCountsFromTheRead(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 3 * time.Second
	a, _ := open(t, url, "agg", ttl)
	b, _ := open(t, url, "agg", ttl)
	akv := &slowKV{KeyValue: a.kv}
	a.kv = akv
	bkv := &slowKV{KeyValue: b.kv, delay: ttl * 8 / 10}
	b.kv = bkv
	var once sync.Once
	bkv.onGet = func() {
		if bkv.slow.Load() {
			once.Do(func() {
				bkv.slow.Store(false)
				akv.failing.Store(true) // the holder is cut off right after the renewal read
			})
		}
	}
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	go a.Keep(t.Context())
	got := acquired(t.Context(), b)
	time.Sleep(time.Second) // b waits, reading the lease
	bkv.slow.Store(true)
	select {
	case <-got:
		if a.Held().Err() == nil {
			t.Fatal("the waiter took over while the holder still counts")
		}
	case <-time.After(4 * ttl):
		t.Fatal("the waiter never took over")
	}
}

// TestWaiterSaysWhoHoldsAGarbageLease: a lease whose value is not a holder's (written by
// hand, another program) still holds the waiter off, and the waiter says so once.
func TestWaiterSaysWhoHoldsAGarbageLease(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	b, nc := open(t, url, "agg", 30*time.Second)
	var logs syncBuffer
	b.logger = slog.New(slog.NewTextHandler(&logs, nil))
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "agg", []byte("not a holder")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := b.Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want it to wait", err)
	}
	if n := strings.Count(logs.String(), "another process holds the lease"); n != 1 {
		t.Fatalf("the waiter logged that the lease is held %d times, want once:\n%s", n, logs.String())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWaitForIsBounded: a lease's value is not trusted to hold waiters off for ever.
func TestWaitForIsBounded(t *testing.T) {
	for _, c := range []struct {
		held string
		want time.Duration
	}{
		{"", 15 * time.Second},
		{"garbage", 15 * time.Second},
		{"-1h", 15 * time.Second},
		{"5s", 15 * time.Second},
		{"1m", time.Minute},
		{"1000h", MaxTTL},
	} {
		if got := waitFor(15*time.Second, c.held); got != c.want {
			t.Errorf("waitFor(15s, %q) = %s, want %s", c.held, got, c.want)
		}
	}
}

// watchLease returns the lease bucket and a watch of the key "agg"'s updates from now on,
// stopped at the test's end.
func watchLease(t *testing.T, nc *nats.Conn) (jetstream.KeyValue, jetstream.KeyWatcher) {
	t.Helper()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(t.Context(), Bucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(t.Context(), "agg", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Stop() })
	return kv, w
}
