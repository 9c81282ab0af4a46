package lease

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

// Bucket is the key-value bucket holding one lease per AGG_CONSUMER, under its name. It is
// apart from the floors' bucket (AGGREGATOR): what is there must never go away.
const Bucket = "AGGREGATOR_LEASE"

// ErrLost is returned by Keep when this process may no longer count: the lease was not
// renewed in time, or another process holds it.
var ErrLost = errors.New("lost the lease")

// Holder is a lease's value: who holds it, for the log and /readyz of those who wait.
type Holder struct {
	ID      string    `json:"id"` // one per process
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Started time.Time `json:"started"`
	TTL     string    `json:"ttl"` // the holder's AGG_LEASE_TTL: a waiter waits the longer of it and its own
	// Released: the holder stopped and wrote nothing more after it; a waiter takes over at once.
	Released bool `json:"released,omitempty"`
}

func (h Holder) attrs() []any {
	return []any{"holder_host", h.Host, "holder_pid", h.PID, "holder_started", h.Started.Format(time.RFC3339)}
}

func (h Holder) String() string {
	return fmt.Sprintf("%s pid %d, started %s", h.Host, h.PID, h.Started.Format(time.RFC3339))
}

type state int

const (
	waiting state = iota
	holding
	lost
)

// Lease is this process's lease for one AGG_CONSUMER.
type Lease struct {
	kv       jetstream.KeyValue
	consumer string
	ttl      time.Duration
	me       Holder
	value    []byte
	logger   *slog.Logger

	held        prometheus.Gauge
	renewErrors prometheus.Counter

	// rev and deadline are the revision of the last renewal and when Held ends unless the
	// next one succeeds; only Acquire, then Keep's goroutine, touch them.
	rev      uint64
	deadline time.Time
	fence    atomic.Pointer[time.Time] // deadline, for Held's Err on any goroutine

	mu      sync.Mutex
	state   state
	holder  Holder                  // while waiting: the process that holds it (zero when unknown)
	why     error                   // once lost
	heldCtx context.Context         // this term's Held: one per time the lease is taken
	lose    context.CancelCauseFunc // ends heldCtx
}

// Open makes or updates Bucket (replicas as the streams', history 2) and returns the lease of
// consumer, with ttl; its metrics are registered on reg.
func Open(ctx context.Context, js jetstream.JetStream, consumer string, ttl time.Duration, replicas int, reg prometheus.Registerer, logger *slog.Logger) (*Lease, error) {
	// A history of 2 keeps the holder's value, and its TTL, behind a delete marker (`nats kv
	// del`): a waiter then waits that TTL, not MaxTTL. A bucket made with history 1 is updated.
	kv, err := bus.EnsureKeyValueHistory(ctx, js, Bucket, "tokenscope aggregator: the process that counts for each AGG_CONSUMER", replicas, 2)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	me := Holder{ID: nuid.Next(), Host: host, PID: os.Getpid(), Started: time.Now().UTC().Truncate(time.Millisecond), TTL: ttl.String()}
	value, _ := json.Marshal(me)
	l := &Lease{
		kv: kv, consumer: consumer, ttl: ttl, me: me, value: value, logger: logger.With("component", "lease"),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "aggregator", Name: "lease_held",
			Help: "1 while this process holds the lease of its AGG_CONSUMER and counts; 0 while it waits for it."}),
		renewErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "aggregator", Name: "lease_renew_errors_total",
			Help: "Renewals of the lease that failed (retried until two thirds of AGG_LEASE_TTL have passed since the last that succeeded; then the process stops counting and waits for the lease again)."}),
	}
	l.newTerm()
	reg.MustRegister(l.held, l.renewErrors)
	return l, nil
}

// newTerm makes the Held of the next time the lease is taken. Called under mu, or before
// the Lease is shared.
func (l *Lease) newTerm() {
	held, lose := context.WithCancelCause(context.Background())
	l.heldCtx, l.lose = heldContext{held, l}, lose
}

// Me returns what this process stores in the lease once it holds it.
func (l *Lease) Me() Holder { return l.me }

func (l *Lease) renewEvery() time.Duration { return l.ttl / 5 }

// fenceAfter is how long after sending its last renewal JetStream acknowledged a holder
// keeps counting: a waiter takes over no sooner than the TTL after it.
func (l *Lease) fenceAfter() time.Duration { return l.ttl * 2 / 3 }

// poll is how often a waiter reads the lease, and a failed renewal is tried again.
func (l *Lease) poll() time.Duration { return min(l.ttl/10, 500*time.Millisecond) }

// MaxTTL is the longest AGG_LEASE_TTL: a waiter waits no longer than it, whatever TTL a
// lease's value claims.
const MaxTTL = 10 * time.Minute

// Acquire returns once this process holds the lease, or with ctx's error when ctx ends
// first. While another process holds it, it waits, and says who holds it once (and again if
// another takes it). It takes a lease never held, or released, at once, and one whose holder
// has not renewed it for the longer of its TTL and the holder's own. A lease deleted by other
// means than a release (`nats kv del`, `nats kv purge`) is waited on as one not renewed: its
// holder counts until its next renewal finds it gone. The bucket's history keeps the
// holder's value, and its TTL, behind a delete's marker; behind a purge's, unless this
// process read it before the marker, it waits MaxTTL: the holder's TTL went with the value.
//
// Acquire may be called again once Keep has returned ErrLost (the process stands by then,
// and Check passes). A lease still holding this process's own last value (no other process
// took it since) is taken back a TTL after the last renewal JetStream acknowledged: from
// then on a waiter could have taken it over, so what this process had in flight when Held
// ended has had the third of the TTL it would have had. Held then returns a new context;
// the one of the lost term stays ended.
func (l *Lease) Acquire(ctx context.Context) error {
	var (
		seen     uint64    // the revision last read
		seenAt   time.Time // when it was first read (the answer came)
		seenTTL  time.Duration
		released bool   // seen is a release
		own      bool   // seen is this process's own value, left as it lost the lease
		lastTTL  string // the TTL of the last holder seen, for a lease then deleted
		failing  bool
		told     bool   // the waiting line was logged
		logged   string // for the holder logged
		start    = time.Now()
	)
	l.mu.Lock()
	if l.state == lost {
		l.state, l.why = waiting, nil // standing by again
	}
	l.mu.Unlock()
	failed := func(err error) {
		if !failing {
			l.logger.Warn("cannot read the lease; retrying", "consumer", l.consumer, "bucket", Bucket, "err", err)
			failing = true
		}
	}
	for {
		now := time.Now()
		rev, value, deleted, err := l.read(ctx)
		switch {
		case errors.Is(err, jetstream.ErrInvalidKey):
			return fmt.Errorf("cannot take the lease of AGG_CONSUMER=%q in %s: %w", l.consumer, Bucket, err)
		case err != nil:
			failed(err)
		case rev == 0: // never held: take it if still so
			failing = false
			rev, err := l.kv.Update(ctx, l.consumer, l.value, 0)
			if err == nil {
				l.take(rev, now, time.Since(start), Holder{}, false)
				return nil
			}
			if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				failed(err)
			}
		default:
			failing = false
			if rev != seen {
				// From the read's answer, not its request: a request slow to reach the server
				// sees a renewal sent after it, and the holder counts until two thirds of its TTL
				// after that.
				seen, seenAt = rev, time.Now()
				var h Holder
				parsed := json.Unmarshal(value, &h) == nil
				if parsed && h.TTL != "" {
					lastTTL = h.TTL
				}
				if deleted {
					h = Holder{} // value is the one before the marker, for its TTL only
				}
				released = parsed && !deleted && h.Released
				own = !deleted && bytes.Equal(value, l.value)
				seenTTL = waitFor(l.ttl, lastTTL)
				if deleted && lastTTL == "" {
					// Only the marker is left: the holder's TTL, and so when its next renewal
					// finds the lease gone, is unknown; it may be up to MaxTTL.
					seenTTL = MaxTTL
				}
				l.mu.Lock()
				l.holder = h
				l.mu.Unlock()
				switch {
				case released:
				case own:
					l.logger.Warn("the lease of this AGG_CONSUMER is still this process's; taking it back a TTL after its last renewal", "consumer", l.consumer, "at", l.retakeAt().Format(time.RFC3339Nano))
					told, logged = true, h.ID
				case deleted:
					l.logger.Warn("the lease of this AGG_CONSUMER was deleted without a release; waiting for its holder to stop", "consumer", l.consumer, "wait", seenTTL.String())
					told, logged = true, ""
				case !told || h.ID != logged:
					told, logged = true, h.ID
					attrs := h.attrs()
					if h.ID == "" {
						attrs = []any{"holder", "unknown (the lease's value is not a holder's)"}
					}
					l.logger.Warn("another process holds the lease of this AGG_CONSUMER; waiting until it stops", append([]any{"consumer", l.consumer}, attrs...)...)
				}
			}
			if own && now.Before(l.retakeAt()) || !own && !released && now.Sub(seenAt) < seenTTL {
				break
			}
			rev, err := l.kv.Update(ctx, l.consumer, l.value, seen)
			if err == nil {
				l.mu.Lock()
				h := l.holder
				l.mu.Unlock()
				if own {
					h = l.me
				}
				l.take(rev, now, time.Since(start), h, released)
				return nil
			}
			if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				failed(err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(l.poll()):
		}
	}
}

// read returns the lease's last revision and value, or whether it was deleted or purged
// (then the value is the last before the marker that the bucket's history still holds, nil
// when none); revision 0 when it was never written.
func (l *Lease) read(ctx context.Context) (rev uint64, value []byte, deleted bool, err error) {
	e, err := l.kv.Get(ctx, l.consumer)
	if err == nil {
		return e.Revision(), e.Value(), false, nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil, false, err
	}
	hist, err := l.kv.History(ctx, l.consumer) // the delete marker, which Get does not return
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, nil, false, nil
	case err != nil:
		return 0, nil, false, err
	}
	last := hist[len(hist)-1]
	if last.Operation() == jetstream.KeyValuePut {
		return last.Revision(), last.Value(), false, nil
	}
	for i := len(hist) - 2; i >= 0; i-- { // at most the bucket's history (64)
		if hist[i].Operation() == jetstream.KeyValuePut {
			return last.Revision(), hist[i].Value(), true, nil
		}
	}
	return last.Revision(), nil, true, nil
}

// waitFor is how long a waiter waits on a revision: the longer of its own TTL and the
// holder's (held), at most MaxTTL.
func waitFor(own time.Duration, held string) time.Duration {
	if d, err := time.ParseDuration(held); err == nil && d > own {
		return min(d, MaxTTL)
	}
	return own
}

// retakeAt is when this process may take back its own lease after losing it: a TTL after
// sending the last renewal JetStream acknowledged (the deadline is two thirds of it after).
func (l *Lease) retakeAt() time.Time { return l.deadline.Add(l.ttl - l.fenceAfter()) }

// take records the lease taken at revision rev, its request sent at sent; from is the
// holder it took over from, zero when the lease was free.
func (l *Lease) take(rev uint64, sent time.Time, waited time.Duration, from Holder, released bool) {
	l.rev = rev
	l.setDeadline(sent.Add(l.fenceAfter()))
	l.mu.Lock()
	if l.heldCtx.(heldContext).Context.Err() != nil {
		l.newTerm() // the lease was lost and is taken again
	}
	l.state, l.holder = holding, Holder{}
	l.mu.Unlock()
	l.held.Set(1)
	attrs := []any{"consumer", l.consumer, "ttl", l.ttl.String(), "waited", waited.Round(time.Millisecond).String()}
	if from.ID == l.me.ID {
		l.logger.Info("took the lease back: no other process took it since this one lost it", attrs...)
		return
	}
	if from.ID != "" && released {
		l.logger.Info("took the lease released by the process that held it", append(attrs, from.attrs()...)...)
		return
	}
	if from.ID != "" {
		l.logger.Info("took over the lease from a process that stopped renewing it", append(attrs, from.attrs()...)...)
		return
	}
	l.logger.Info("took the lease", attrs...)
}

// Held returns a context that ends once this process may no longer count: Keep found the
// lease lost, or did not renew it in time. Every write for the consumer is made under it,
// and its Err is asked right before each: it reads the clock, so that a process paused past
// its deadline (a GC pause, SIGSTOP) finds the lease lost at once when it resumes, before
// Keep's late timer has run. Once the lease is lost and taken again (Acquire), it returns a
// new context.
func (l *Lease) Held() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heldCtx
}

func (l *Lease) setDeadline(d time.Time) {
	l.deadline = d
	l.fence.Store(&d)
}

// heldContext is Held: its Err ends it once the deadline has passed.
type heldContext struct {
	context.Context // ended by lose
	l               *Lease
}

func (h heldContext) Err() error {
	if err := h.Context.Err(); err != nil {
		return err
	}
	if d := h.l.fence.Load(); d != nil && !time.Now().Before(*d) {
		h.l.lost(fmt.Errorf("%w: the lease of AGG_CONSUMER=%s was not renewed for %s (AGG_LEASE_TTL=%s): this process did not run in time", ErrLost, h.l.consumer, h.l.fenceAfter(), h.l.ttl))
	}
	return h.Context.Err()
}

// Keep renews the lease every fifth of the TTL until ctx ends (it returns nil; the lease is
// still held, for Release; or the error wrapping ErrLost if Held has ended meanwhile). A failed renewal is tried again every poll; once two thirds of
// the TTL have passed since the last renewal JetStream acknowledged was sent, or another
// process holds the lease, Held ends and Keep returns an error wrapping ErrLost.
func (l *Lease) Keep(ctx context.Context) error {
	t := time.NewTimer(min(l.renewEvery(), time.Until(l.deadline)))
	defer t.Stop()
	var last error // the last renewal's failure, nil when it succeeded
	for {
		select {
		case <-ctx.Done():
			return l.lostWhy()
		case <-t.C:
		}
		if !time.Now().Before(l.deadline) {
			if last == nil {
				last = errors.New("no renewal could be sent in time")
			}
			why := fmt.Errorf("the lease of AGG_CONSUMER=%s was not renewed for %s (AGG_LEASE_TTL=%s): %w", l.consumer, l.fenceAfter(), l.ttl, last)
			return l.lost(fmt.Errorf("%w: %w", ErrLost, why))
		}
		rctx, cancel := context.WithDeadline(ctx, l.deadline)
		sent := time.Now()
		rev, err := l.kv.Update(rctx, l.consumer, l.value, l.rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			err = l.recheck(rctx)
		}
		cancel()
		switch {
		case err == nil && rev > 0:
			l.rev = rev
			l.setDeadline(sent.Add(l.fenceAfter()))
			if last != nil {
				l.logger.Info("renewing the lease again", "consumer", l.consumer)
			}
			last = nil
			t.Reset(l.renewEvery())
			continue
		case errors.Is(err, ErrLost):
			return l.lost(err)
		case ctx.Err() != nil:
			return l.lostWhy()
		case err != nil:
			l.renewErrors.Inc()
			if last == nil {
				l.logger.Warn("cannot renew the lease; retrying", "consumer", l.consumer, "fenced_in", time.Until(l.deadline).Round(time.Millisecond).String(), "err", err)
			}
			last = err
		}
		t.Reset(max(0, min(l.poll(), time.Until(l.deadline))))
	}
}

// lostWhy returns why Held ended, nil while it lasts: a write may have found its deadline
// passed (Held's Err) before Keep's timer ran, and Keep, stopped then, must not say the
// lease is still held.
func (l *Lease) lostWhy() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == lost {
		return l.why
	}
	return nil
}

// recheck reads the lease after a renewal found another revision: the renewal before may
// have been stored with its acknowledgement lost, and then the lease is still this
// process's (at that revision, renewed at the next try). Otherwise it is lost.
func (l *Lease) recheck(ctx context.Context) error {
	e, err := l.kv.Get(ctx, l.consumer)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("%w: the lease of AGG_CONSUMER=%s was deleted", ErrLost, l.consumer)
	case err != nil:
		return err
	case bytes.Equal(e.Value(), l.value):
		l.rev = e.Revision()
		return nil
	}
	var h Holder
	if json.Unmarshal(e.Value(), &h) != nil {
		return fmt.Errorf("%w: the lease of AGG_CONSUMER=%s holds %q", ErrLost, l.consumer, truncate(e.Value()))
	}
	return fmt.Errorf("%w: the lease of AGG_CONSUMER=%s is held by %s", ErrLost, l.consumer, h)
}

// lost ends Held with why, once; it returns the first reason.
func (l *Lease) lost(why error) error {
	l.mu.Lock()
	if l.state == lost {
		why = l.why
		l.mu.Unlock()
		return why
	}
	l.state, l.why = lost, why
	lose := l.lose
	l.mu.Unlock()
	lose(why)
	l.held.Set(0)
	l.logger.Error("stopped counting: this process no longer holds the lease of its AGG_CONSUMER", "consumer", l.consumer, "err", why)
	return why
}

// Release marks the lease released, if this process still holds it, so that a process
// waiting for it takes over at once. Call it once Keep has returned nil and nothing more is written.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	st := l.state
	l.state = lost
	l.why = errors.New("the lease was released at shutdown")
	why, lose := l.why, l.lose
	l.mu.Unlock()
	lose(why)
	l.held.Set(0)
	if st != holding {
		return nil
	}
	if err := l.recheck(ctx); err != nil {
		if errors.Is(err, ErrLost) {
			return nil
		}
		return fmt.Errorf("cannot release the lease of AGG_CONSUMER=%s: %w", l.consumer, err)
	}
	released := l.me
	released.Released = true
	value, _ := json.Marshal(released)
	if _, err := l.kv.Update(ctx, l.consumer, value, l.rev); err != nil {
		return fmt.Errorf("cannot release the lease of AGG_CONSUMER=%s: %w", l.consumer, err)
	}
	return nil
}

// Abandon stops this process holding the lease without releasing it: a write it gave up on
// may still land, so the next process waits for the lease to go stale, as after a crash.
// Held ends, and aggregator_lease_held reads 0 from now on. Call it once Keep has returned.
func (l *Lease) Abandon() {
	l.mu.Lock()
	if l.state == lost {
		l.mu.Unlock()
		return
	}
	l.state = lost
	l.why = errors.New("the lease was left to go stale at shutdown: a write to ClickHouse was left unfinished")
	why, lose := l.why, l.lose
	l.mu.Unlock()
	lose(why)
	l.held.Set(0)
}

// Check fails, for /readyz, once this process has lost the lease, until it waits for it again
// (Acquire: its pipelines have stopped), and once it has released or abandoned it at
// shutdown. A process waiting for the lease is ready: it stands by, and a rolling update that
// waits for the new process to be ready before it stops the old one goes on, the old one's
// stop handing the lease over; it has logged whom it waits for.
func (l *Lease) Check(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == lost {
		return l.why
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}
