package replay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

func TestParseBurst(t *testing.T) {
	if err := DefaultBurst.Validate(); err != nil {
		t.Fatal(err)
	}
	f := func(s string, want Burst) {
		t.Helper()
		got, err := ParseBurst(s)
		if err != nil || got != want {
			t.Errorf("ParseBurst(%q) = %+v, %v; want %+v", s, got, err, want)
		}
	}
	f("at=10s, for=20s,every=1m,clients=64", Burst{At: 10 * time.Second, For: 20 * time.Second, Every: time.Minute, Clients: 64})
	f("at=0s", Burst{For: DefaultBurst.For, Every: DefaultBurst.Every, Clients: DefaultBurst.Clients})
	f("clients=8", Burst{At: DefaultBurst.At, For: DefaultBurst.For, Every: DefaultBurst.Every, Clients: 8})

	// Each error names the part that is wrong.
	bad := func(s, part string) {
		t.Helper()
		if _, err := ParseBurst(s); err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("ParseBurst(%q): error %v, want one naming %s", s, err, part)
		}
	}
	bad("at=4x", `at="4x"`)
	bad("for=", `for=""`)
	bad("clients=many", `clients="many"`)
	bad("clients=0", "clients=0")
	bad("clients=-3", "clients=-3")
	bad("clients=20000", "clients=20000")
	bad("at=-1s", "at=-1s")
	bad("for=0s", "for=0s")
	bad("for=3m", "every=2m0s must be longer than for=3m0s")
	bad("start=1m", `unknown part "start"`)
	bad("at=1m,,for=1m", `"" is not key=value`)
	bad("40s", `"40s" is not key=value`)
}

func TestBurstWindow(t *testing.T) {
	b := Burst{At: 10 * time.Second, For: 5 * time.Second, Every: 20 * time.Second, Clients: 1}
	f := func(elapsed time.Duration, on bool, until time.Duration) {
		t.Helper()
		if gotOn, gotUntil := b.window(elapsed); gotOn != on || gotUntil != until {
			t.Errorf("window(%s) = %v, %s; want %v, %s", elapsed, gotOn, gotUntil, on, until)
		}
	}
	f(0, false, 10*time.Second)
	f(9*time.Second, false, 10*time.Second)
	f(10*time.Second, true, 15*time.Second)
	f(14*time.Second, true, 15*time.Second)
	f(15*time.Second, false, 30*time.Second)
	f(30*time.Second, true, 35*time.Second)
	f(62*time.Second, false, 70*time.Second)
}

// testClock is the burst's clock in a test: sleep tells the test when it would wake and
// waits until the test wakes it, which sets the time to then.
type testClock struct {
	mu       sync.Mutex
	t        time.Time
	sleeping chan time.Time
	wake     chan struct{}
	woke     chan struct{} // if set, told once the time is set to the wake's
}

// waitAsleep waits for the burst to sleep and requires it to sleep until want after start.
func (c *testClock) waitAsleep(t *testing.T, start time.Time, want time.Duration) {
	t.Helper()
	select {
	case until := <-c.sleeping:
		if got := until.Sub(start); got != want {
			t.Fatalf("the burst sleeps until %s after the start, want %s", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the burst never slept until %s", want)
	}
}

func (c *testClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *testClock) sleep(ctx context.Context, until time.Time) bool {
	select {
	case c.sleeping <- until:
	case <-ctx.Done():
		return false
	}
	select {
	case <-c.wake:
		c.mu.Lock()
		c.t = until
		c.mu.Unlock()
		if c.woke != nil {
			c.woke <- struct{}{}
		}
		return true
	case <-ctx.Done():
		return false
	}
}

// holdingServer answers a chat completion once the test lets the requests of the current
// hold go, and counts what it got and how many it held at once.
type holdingServer struct {
	mu                 sync.Mutex
	hold               chan struct{}
	arrived            chan struct{}
	inFlight, most     int
	total              atomic.Int64
	badPath, badPrompt atomic.Int64
}

// waitArrivals waits for n requests to reach s, named where in the failure.
func (s *holdingServer) waitArrivals(t *testing.T, n int, where string) {
	t.Helper()
	for i := range n {
		select {
		case <-s.arrived:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of the burst's %d requests reached %s", i, n, where)
		}
	}
}

func (s *holdingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path != "/v1/chat/completions" {
		s.badPath.Add(1)
	}
	if !strings.Contains(string(body), burstPrefix) || !strings.Contains(string(body), `"model":"llama-3.1-70b"`) {
		s.badPrompt.Add(1)
	}
	s.total.Add(1)
	s.mu.Lock()
	hold := s.hold
	s.inFlight++
	s.most = max(s.most, s.inFlight)
	s.mu.Unlock()
	select { // a request the client gave up on leaves
	case s.arrived <- struct{}{}:
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	case <-r.Context().Done():
	}
	s.mu.Lock()
	s.inFlight--
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":950,"completion_tokens":1}}`)
}

func (s *holdingServer) newHold() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = make(chan struct{})
	return s.hold
}

type countingEmitter struct {
	n    atomic.Int64
	mu   sync.Mutex
	last *events.RequestEvent
}

func (e *countingEmitter) Emit(ev *events.RequestEvent, _ time.Time) error {
	e.n.Add(1)
	e.mu.Lock()
	e.last = ev
	e.mu.Unlock()
	return nil
}

// TestBurstSendsInItsWindows: through a proxy URL (here a server that holds each request
// until told), the burst keeps Clients requests in flight from At, sends none before, none
// once its window closed and none between windows, and starts again Every later.
func TestBurstSendsInItsWindows(t *testing.T) {
	const clients = 8
	srv := &holdingServer{arrived: make(chan struct{}, 4*clients)}
	srv.newHold()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close) // after the burst has stopped (cleanups run last first)
	target := &Target{Client: &llmclient.Client{BaseURL: hs.URL + "/v1", Protocol: meter.OpenAIChat, HTTP: hs.Client()}}
	b := Burst{At: 10 * time.Second, For: 5 * time.Second, Every: 20 * time.Second, Clients: clients}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &testClock{t: start, sleeping: make(chan time.Time), wake: make(chan struct{}), woke: make(chan struct{})}
	var stats Stats
	em := &countingEmitter{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runBurst(ctx, b, start, clock.now, clock.sleep, target, Options{Model: "llama-3.1-70b", Scene: "default", Env: "dev"}, em, &stats)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	between := func(round int) {
		t.Helper()
		// Asleep until the next window: every request of the earlier windows has ended.
		srv.mu.Lock()
		inFlight, most := srv.inFlight, srv.most
		srv.mu.Unlock()
		if got, want := srv.total.Load(), int64(round*clients); got != want || inFlight != 0 {
			t.Fatalf("before window %d: the proxy got %d requests (%d in flight), want %d, none in flight: one per client in each window, none outside", round+1, got, inFlight, want)
		}
		if round > 0 && most != clients {
			t.Fatalf("the proxy held %d of the burst's requests at once, want %d", most, clients)
		}
	}
	for round, at := range []time.Duration{10 * time.Second, 30 * time.Second} {
		clock.waitAsleep(t, start, at)
		between(round)
		hold := srv.newHold()
		clock.wake <- struct{}{}
		<-clock.woke
		// In the window: every client's request is in flight at once.
		clock.waitAsleep(t, start, at+b.For)
		srv.waitArrivals(t, clients, "the proxy")
		// The window closes while they are held; each client sends no more once its
		// request ends.
		clock.wake <- struct{}{}
		<-clock.woke
		close(hold)
	}
	clock.waitAsleep(t, start, 50*time.Second)
	between(2)
	if got := stats.Burst.Load(); got != 2*clients {
		t.Errorf("stats.Burst = %d, want %d", got, 2*clients)
	}
	if got := stats.BurstOK.Load(); got != 2*clients {
		t.Errorf("stats.BurstOK = %d, want %d", got, 2*clients)
	}
	if got := em.n.Load(); got != 2*clients {
		t.Errorf("%d events emitted, want one per request, %d", got, 2*clients)
	}
	// Each event is labelled as the replay's own (Run's) are.
	if ev := em.last; ev == nil || ev.Model != "llama-3.1-70b" || ev.Scene != "default" || ev.Env != "dev" ||
		ev.Status != events.StatusOK || ev.InputTokens != 950 || ev.Provider != meter.OpenAIChat.Provider() {
		t.Errorf("burst event %+v: want model llama-3.1-70b, scene default, env dev, ok, 950 input tokens, provider %s", ev, meter.OpenAIChat.Provider())
	}
	if srv.badPath.Load() > 0 || srv.badPrompt.Load() > 0 {
		t.Errorf("%d requests not to /v1/chat/completions, %d without the model or the shared prefix", srv.badPath.Load(), srv.badPrompt.Load())
	}
}

// TestParseBurstBounds: durations so long that the next window's time overflows (and the
// burst would wake at once, forever, and spin) and client counts past int are refused with
// an error that names the part and its bound.
func TestParseBurstBounds(t *testing.T) {
	bad := func(s, part string) {
		t.Helper()
		if _, err := ParseBurst(s); err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("ParseBurst(%q): error %v, want one naming %s", s, err, part)
		}
	}
	bad("at=1h,for=1s,every=2562047h", "every=2562047h0m0s must be at most 8760h")
	bad("at=2562047h", "at=2562047h0m0s must be at most 8760h")
	bad("for=1000000h,every=1000001h", "at most 8760h")
	bad("clients=99999999999999999999", `clients="99999999999999999999" is not a whole number from 1 to 10000`)
	bad("clients=1e9", "from 1 to 10000")
	// Windows of nanoseconds would start and stop every client, back to back, without pause.
	bad("at=0s,for=1ns,every=2ns", "for=1ns must be at least 1s")

	// Within the bounds, the next time the burst wakes is always ahead of it.
	b, err := ParseBurst("at=8760h,for=8759h,every=8760h")
	if err != nil {
		t.Fatal(err)
	}
	for _, elapsed := range []time.Duration{0, b.At, b.At + b.For, b.At + 1000*b.Every + b.For} {
		if _, until := b.window(elapsed); until <= elapsed {
			t.Errorf("window(%s): next change at %s, not after it", elapsed, until)
		}
	}
}

// TestBurstTarget: the burst's client has connections of its own, at most one per client
// (a slow endpoint cannot make it open more), and gives up on a request after
// BurstTimeout, as the CLI's burst does, so that an endpoint that never answers holds its
// clients for two minutes, not the replay's ten.
func TestBurstTarget(t *testing.T) {
	base := &llmclient.Client{BaseURL: "http://127.0.0.1:8080", APIKey: "k", Protocol: meter.Anthropic,
		HTTP: &http.Client{Timeout: 600 * time.Second}}
	tg := NewBurstTarget(base, true, 192)
	if tg.Client == base || tg.Client.HTTP == base.HTTP {
		t.Fatal("the burst shares the replay's client")
	}
	if tg.Client.BaseURL != base.BaseURL || tg.Client.APIKey != "k" || tg.Client.Protocol != meter.Anthropic || !tg.Stream {
		t.Errorf("burst target %+v does not send as the replay does", tg.Client)
	}
	if tg.Client.HTTP.Timeout != BurstTimeout || BurstTimeout != 2*time.Minute {
		t.Errorf("burst request timeout %s, want %s", tg.Client.HTTP.Timeout, 2*time.Minute)
	}
	tr, ok := tg.Client.HTTP.Transport.(*http.Transport)
	if !ok || tr.MaxConnsPerHost != 192 || tr.MaxIdleConnsPerHost != 192 || tr.IdleConnTimeout <= 0 {
		t.Errorf("burst transport %+v: want at most 192 connections, 192 idle, closed once idle", tr)
	}
}

// TestBurstSlowEndpoint: against an endpoint that holds every request, the burst's requests
// outlive their window but never pile up: the next window's clients start only once the
// last window's requests ended, so no more than Clients are ever in flight; and the end
// of the replay ends the requests held, and the burst, without the endpoint answering.
func TestBurstSlowEndpoint(t *testing.T) {
	const clients = 4
	srv := &holdingServer{arrived: make(chan struct{}, 4*clients)}
	hold := srv.newHold()
	hs := httptest.NewServer(srv)
	target := &Target{Client: &llmclient.Client{BaseURL: hs.URL + "/v1", Protocol: meter.OpenAIChat, HTTP: hs.Client()}}
	b := Burst{At: 10 * time.Second, For: 5 * time.Second, Every: 20 * time.Second, Clients: clients}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &testClock{t: start, sleeping: make(chan time.Time), wake: make(chan struct{}), woke: make(chan struct{})}
	var stats Stats
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runBurst(ctx, b, start, clock.now, clock.sleep, target, Options{Model: "llama-3.1-70b"}, &countingEmitter{}, &stats)
	}()
	clock.waitAsleep(t, start, 10*time.Second)
	clock.wake <- struct{}{}
	<-clock.woke
	clock.waitAsleep(t, start, 15*time.Second)
	srv.waitArrivals(t, clients, "the endpoint")
	clock.wake <- struct{}{} // the window closes with its requests held
	<-clock.woke
	// The held requests outlive the next window's start; when they end, the burst joins
	// that window for what is left of it, with its clients only.
	clock.mu.Lock()
	clock.t = start.Add(31 * time.Second)
	clock.mu.Unlock()
	srv.newHold() // never let go
	close(hold)
	clock.waitAsleep(t, start, 35*time.Second)
	srv.waitArrivals(t, clients, "the endpoint")
	srv.mu.Lock()
	most := srv.most
	srv.mu.Unlock()
	if most != clients || srv.total.Load() != 2*clients {
		t.Fatalf("the endpoint held %d burst requests at once and got %d, want %d at once, %d in all", most, srv.total.Load(), clients, 2*clients)
	}
	// The replay ends while the endpoint holds the second window's requests.
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the burst did not end with the replay while the endpoint held its requests")
	}
	hs.Close() // returns once every request the endpoint held has ended
	if got := stats.Burst.Load(); got != 2*clients {
		t.Errorf("stats.Burst = %d, want %d", got, 2*clients)
	}
}
