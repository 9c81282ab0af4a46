package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// heldUpKV holds a renewal until released, then stores it whatever its context says: the
// reply of a renewal sent before a pause (SIGSTOP) racing its deadline once the process
// resumes, as nats.go may return either.
type heldUpKV struct {
	jetstream.KeyValue
	entered, release chan struct{}
}

func (h *heldUpKV) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	select {
	case h.entered <- struct{}{}:
	default:
	}
	<-h.release
	return h.KeyValue.Update(context.Background(), key, value, rev)
}

// TestKeepEndsWhenHeldEndedDuringARenewal: a write found the deadline passed (Held ended,
// the lease lost) while a renewal was in flight that then succeeds. Keep must return
// ErrLost, not renew on: the process would otherwise neither count nor stand by. (The
// renewal's own deadline has passed by Keep's next tick, so it does.)
func TestKeepEndsWhenHeldEndedDuringARenewal(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 1500 * time.Millisecond
	a, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	kv := &heldUpKV{KeyValue: a.kv, entered: make(chan struct{}, 1), release: make(chan struct{})}
	a.kv = kv
	ctx, cancel := context.WithTimeout(t.Context(), 3*ttl)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Keep(ctx) }()
	<-kv.entered
	time.Sleep(time.Until(*a.fence.Load()) + 10*time.Millisecond)
	if a.Held().Err() == nil {
		t.Fatal("Held has not ended past its deadline")
	}
	close(kv.release)
	if err := <-done; !errors.Is(err, ErrLost) {
		t.Fatalf("Keep = %v once Held had ended, want ErrLost", err)
	}
}

// TestKeepStoppedAfterHeldEndedSaysLost: Held ended by a write that read the clock past the
// deadline, and Keep stopped (its context ended) before its timer had run: it must still
// say the lease was lost, or the process takes the end of counting for a shutdown.
func TestKeepStoppedAfterHeldEndedSaysLost(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 600 * time.Millisecond
	a, _ := open(t, url, "agg", ttl)
	for i := range 20 {
		if err := a.Acquire(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(*a.fence.Load()) + 10*time.Millisecond)
		if a.Held().Err() == nil {
			t.Fatal("Held has not ended past its deadline")
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if err := a.Keep(ctx); !errors.Is(err, ErrLost) {
			t.Fatalf("try %d: Keep = %v once Held had ended, want ErrLost", i, err)
		}
	}
}

// lostAckKV stores the first renewal but answers as if its reply were lost, and fails every
// later one, as a link gone right after the server applied a renewal.
type lostAckKV struct {
	jetstream.KeyValue
	mu      sync.Mutex
	applied bool
}

func (k *lostAckKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.applied {
		k.applied = true
		if _, err := k.KeyValue.Update(ctx, key, value, rev); err != nil {
			return 0, err
		}
	}
	return 0, context.DeadlineExceeded
}

// TestRetakeAfterARenewalWhoseAckWasLost: the server applied the last renewal but its reply
// was lost, so the lease's revision moved past the one this process knows. Acquire compares
// on the revision it reads, not the one it renewed last: it takes its lease back rather
// than wait on itself.
func TestRetakeAfterARenewalWhoseAckWasLost(t *testing.T) {
	url := testbed.NATS(t).ClientURL()
	const ttl = 1500 * time.Millisecond
	a, _ := open(t, url, "agg", ttl)
	if err := a.Acquire(t.Context()); err != nil {
		t.Fatal(err)
	}
	known := a.rev
	kv := a.kv
	a.kv = &lostAckKV{KeyValue: kv}
	if err := a.Keep(t.Context()); !errors.Is(err, ErrLost) {
		t.Fatalf("Keep = %v, want ErrLost", err)
	}
	if e, err := kv.Get(t.Context(), "agg"); err != nil || e.Revision() == known {
		t.Fatalf("the renewal was not applied: %v, %v", e, err)
	}
	a.kv = kv
	ctx, cancel := context.WithTimeout(t.Context(), 3*ttl)
	defer cancel()
	if err := a.Acquire(ctx); err != nil {
		t.Fatalf("Acquire = %v: the process waits on its own lease", err)
	}
	if a.Held().Err() != nil {
		t.Fatal("taken back, but Held has ended")
	}
}
