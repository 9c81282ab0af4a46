package replay

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
)

// Burst is a recurring incident of real load: from At after the replay starts, for For,
// every Every (wall-clock time, not trace time: -speed does not change it), Clients more
// requests are kept in flight on top of the replayed ones, each sent as soon as the last
// one of its client ended. Against an engine whose batch holds the replay, the burst
// overruns it: requests wait in its queue and TTFT grows by the queueing delay.
//
// The spec and defaults are those of `tokenscope demo -incident` (cli/internal/demo), which
// runs the same burst beside its own stack; the two cannot share code (the CLI's demo package
// is internal to the CLI's module), so they share the format: at=40s,for=40s,every=2m, plus
// clients here.
type Burst struct {
	At, For, Every time.Duration
	Clients        int
}

// DefaultBurst is the demo's: 192 clients (three times the fake engine's batch of 64) for
// 40 s of every 2 minutes, the first 40 s in.
var DefaultBurst = Burst{At: 40 * time.Second, For: 40 * time.Second, Every: 2 * time.Minute, Clients: 192}

// The burst's requests, as the demo's: a shared prefix the engine's prefix cache holds, then
// a question of its own, and a short answer, so that their TTFT is queueing, not prefill.
const (
	burstPrefixWords = 352
	burstWords       = 600
	burstTokens      = 64
	maxBurstClients  = 10_000
	// maxBurstDuration bounds at, for and every, so that the times the burst computes
	// (at + k×every + every) never overflow.
	maxBurstDuration = 8760 * time.Hour
)

// ParseBurst reads at=40s,for=40s,every=2m,clients=192; a part left out keeps
// DefaultBurst's. An error names the part that is wrong.
func ParseBurst(s string) (Burst, error) {
	b := DefaultBurst
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return b, fmt.Errorf("burst %q: %q is not key=value (at, for, every, clients)", s, part)
		}
		var err error
		switch k {
		case "at":
			b.At, err = time.ParseDuration(v)
		case "for":
			b.For, err = time.ParseDuration(v)
		case "every":
			b.Every, err = time.ParseDuration(v)
		case "clients":
			b.Clients, err = strconv.Atoi(v)
		default:
			return b, fmt.Errorf("burst %q: unknown part %q (at, for, every, clients)", s, k)
		}
		if err != nil {
			what := "a duration such as 40s"
			if k == "clients" {
				what = fmt.Sprintf("a whole number from 1 to %d", maxBurstClients)
			}
			return b, fmt.Errorf("burst %q: %s=%q is not %s", s, k, v, what)
		}
	}
	if err := b.Validate(); err != nil {
		return b, fmt.Errorf("burst %q: %w", s, err)
	}
	return b, nil
}

// Validate names the part with a value b cannot run with.
func (b Burst) Validate() error {
	switch {
	case b.At < 0:
		return fmt.Errorf("at=%s must not be negative", b.At)
	case b.For < time.Second:
		return fmt.Errorf("for=%s must be at least 1s", b.For)
	case b.At > maxBurstDuration:
		return fmt.Errorf("at=%s must be at most %s", b.At, maxBurstDuration)
	case b.Every > maxBurstDuration:
		return fmt.Errorf("every=%s must be at most %s", b.Every, maxBurstDuration)
	case b.Every <= b.For:
		return fmt.Errorf("every=%s must be longer than for=%s (the burst must end before the next one)", b.Every, b.For)
	case b.Clients < 1 || b.Clients > maxBurstClients:
		return fmt.Errorf("clients=%d must be from 1 to %d", b.Clients, maxBurstClients)
	}
	return nil
}

// window reports whether the burst runs elapsed after the start, and until when it does or
// when it next starts.
func (b Burst) window(elapsed time.Duration) (bool, time.Duration) {
	if elapsed < b.At {
		return false, b.At
	}
	k := (elapsed - b.At) / b.Every
	start := b.At + k*b.Every
	if elapsed < start+b.For {
		return true, start + b.For
	}
	return false, start + b.Every
}

// BurstTimeout is how long a burst request may take, the CLI's burst's: an endpoint that
// never answers holds the burst's clients (and delays its next window) this long at most.
const BurstTimeout = 2 * time.Minute

// NewBurstTarget is the burst's target: c's endpoint, protocol and key, on a client of its
// own (the burst never takes the replay's connections) that opens at most one connection
// per client, closes those left idle between windows, and gives up after BurstTimeout.
func NewBurstTarget(c *llmclient.Client, stream bool, clients int) *Target {
	tr := &http.Transport{MaxConnsPerHost: clients, MaxIdleConnsPerHost: clients, IdleConnTimeout: 90 * time.Second,
		DisableCompression: true}
	bc := *c
	bc.HTTP = &http.Client{Transport: tr, Timeout: BurstTimeout}
	return &Target{Client: &bc, Stream: stream, Concurrency: clients}
}

// RunBurst sends b's requests to t from start until ctx ends, with the labels of opts,
// emitting one event per request as Run does; stats count them apart (Burst, BurstOK).
// A request sent during a window runs to its end, as a user's would.
func RunBurst(ctx context.Context, b Burst, start time.Time, t *Target, opts Options, emit Emitter, stats *Stats) {
	runBurst(ctx, b, start, time.Now, sleepUntil, t, opts, emit, stats)
}

func sleepUntil(ctx context.Context, until time.Time) bool {
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// runBurst is RunBurst with its clock: now, and sleep, which waits until a time and reports
// false if ctx ended first.
func runBurst(ctx context.Context, b Burst, start time.Time, now func() time.Time, sleep func(context.Context, time.Time) bool,
	t *Target, opts Options, emit Emitter, stats *Stats) {
	for ctx.Err() == nil {
		on, until := b.window(now().Sub(start))
		if !on {
			if !sleep(ctx, start.Add(until)) {
				return
			}
			continue
		}
		// A client sends no request once the window's end has come, whether or not the
		// window's context is cancelled yet.
		end := start.Add(until)
		wctx, closeWindow := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for c := range b.Clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; wctx.Err() == nil && now().Before(end); i++ {
					burstOne(ctx, wctx, t, opts, c*1_000_003+i, emit, stats)
				}
			}()
		}
		sleep(ctx, end)
		closeWindow()
		wg.Wait()
	}
}

// burstOne sends one request of the burst; wctx is the window's, ctx the replay's.
func burstOne(ctx, wctx context.Context, t *Target, opts Options, n int, emit Emitter, stats *Stats) {
	stats.Burst.Add(1)
	out := t.Client.Do(ctx, llmclient.Request{Model: opts.Model, Prompt: burstPrompt(n), MaxTokens: burstTokens, Stream: t.Stream})
	if out.Status == events.StatusCanceled && ctx.Err() != nil {
		return
	}
	if out.Status == events.StatusOK {
		stats.BurstOK.Add(1)
	}
	ev := out.Event(opts.Model, opts.Scene, opts.Env, t.Client.Protocol.Provider(), opts.Instance, t.Stream)
	if emit.Emit(ev, time.Now()) != nil {
		stats.Unpublished.Add(1)
	}
	if out.Status != events.StatusOK {
		// The endpoint is away or refuses: do not spin, but leave when the window closes.
		pause := time.NewTimer(100 * time.Millisecond)
		defer pause.Stop()
		select {
		case <-pause.C:
		case <-wctx.Done():
		}
	}
}

// burstPrefix is the prefix every burst request shares (22 of the fake engine's 16-token
// cache blocks).
var burstPrefix = llmclient.Prompt(burstPrefixWords, 0)

func burstPrompt(n int) string {
	var q strings.Builder
	q.Grow(len(burstPrefix) + burstWords*6 + 20)
	q.WriteString(burstPrefix)
	fmt.Fprintf(&q, " question %d:", n)
	for i := range burstWords {
		q.WriteString(" w")
		q.WriteString(strconv.Itoa((n + i) % 997))
	}
	return q.String()
}
