package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The demo's fake engine and the load burst that overruns it: the fake runs at most
// engineBatch requests at once, the burst keeps burstClients requests in flight on top of
// the steady load, so requests wait in the engine's queue and TTFT grows by the queueing
// delay, not by prefill. The batch holds the proxied load's peaks with room to spare (the
// generated conversation workload's swell and its own ×3 bursts, about 53 requests
// running at once at 1×), so that between incidents nothing queues and a queue left by an
// incident drains within seconds; the burst's clients, three times the batch, overrun it.
const (
	engineTTFT       = 120 * time.Millisecond
	enginePrefillPer = 150 * time.Millisecond // per 1k uncached prompt tokens
	engineTPOT       = 15 * time.Millisecond
	engineBatch      = 64
	engineKVTokens   = 256_000 // 4,000 per running request
	burstClients     = 192
	burstWords       = 600 // words of each burst request's question, after the shared system prompt
	burstTokens      = 64  // output tokens of each burst request
)

// Incident is when the burst runs: from At after the start, for For, every Every.
type Incident struct {
	At, For, Every time.Duration
}

// DefaultIncident overruns the engine for 40 s of every 2 minutes, the first 40 s in.
var DefaultIncident = Incident{At: 40 * time.Second, For: 40 * time.Second, Every: 2 * time.Minute}

// maxIncidentTime bounds at and every, so that the times active adds up never overflow (a
// wrapped time would have the burst start and stop without pause).
const maxIncidentTime = 8760 * time.Hour

// Validate names the bad field.
func (in Incident) Validate() error {
	switch {
	case in.At < 0 || in.For < time.Second || in.Every <= in.For:
		return fmt.Errorf("incident at %s for %s every %s: want at ≥ 0, for ≥ 1s and every > for", in.At, in.For, in.Every)
	case in.At > maxIncidentTime || in.Every > maxIncidentTime:
		return fmt.Errorf("incident at %s every %s: want each at most %s", in.At, in.Every, maxIncidentTime)
	}
	return nil
}

// ParseIncident reads at=40s,for=40s,every=2m; a part left out keeps DefaultIncident's.
func ParseIncident(s string) (Incident, error) {
	in := DefaultIncident
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		d, err := time.ParseDuration(v)
		if !ok || err != nil {
			return in, fmt.Errorf("incident %q: want at=…,for=…,every=… with durations", s)
		}
		switch k {
		case "at":
			in.At = d
		case "for":
			in.For = d
		case "every":
			in.Every = d
		default:
			return in, fmt.Errorf("incident %q: unknown part %q (at, for, every)", s, k)
		}
	}
	return in, in.Validate()
}

// active reports whether the burst runs elapsed after the start, and until when.
func (in Incident) active(elapsed time.Duration) (bool, time.Duration) {
	if elapsed < in.At {
		return false, in.At
	}
	k := (elapsed - in.At) / in.Every
	start := in.At + k*in.Every
	if elapsed < start+in.For {
		return true, start + in.For
	}
	return false, start + in.Every
}

// burst is the incident's load: chat requests sent back to back by burstClients clients
// through the proxy, each with the same system prompt (a prefix the engine caches).
type burst struct {
	url, model string
	in         Incident
	client     *http.Client
	sent, ok   atomic.Uint64
}

func newBurst(proxyURL, model string, in Incident) *burst {
	tr := &http.Transport{MaxIdleConnsPerHost: burstClients, DisableCompression: true}
	return &burst{url: proxyURL + "/v1/chat/completions", model: model, in: in,
		client: &http.Client{Transport: tr, Timeout: 2 * time.Minute}}
}

// run sends the bursts until ctx ends; started is the demo's start.
func (b *burst) run(ctx context.Context, started time.Time) {
	defer b.client.CloseIdleConnections()
	for {
		on, until := b.in.active(time.Since(started))
		if !on {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(started.Add(until))):
			}
			continue
		}
		bctx, cancel := context.WithDeadline(ctx, started.Add(until))
		var wg sync.WaitGroup
		for c := range burstClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; bctx.Err() == nil; i++ {
					b.one(ctx, bctx, c*100_000+i)
				}
			}()
		}
		wg.Wait()
		cancel()
		if ctx.Err() != nil {
			return
		}
	}
}

// one sends one request; a request started during the burst runs to its end (ctx, not
// the burst's deadline), as a user's would.
func (b *burst) one(ctx, bctx context.Context, n int) {
	body := b.body(n)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	b.sent.Add(1)
	resp, err := b.client.Do(req)
	if err != nil {
		if bctx.Err() == nil {
			sleepCtx(bctx, 100*time.Millisecond) // the proxy is away: do not spin
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		b.ok.Add(1)
	} else {
		sleepCtx(bctx, 100*time.Millisecond)
	}
}

// systemPrompt is the burst's shared prefix: 352 words, 22 of the engine's 16-token cache blocks.
var systemPrompt = strings.TrimSpace(strings.Repeat("you are the support assistant of a shop answer briefly and politely ", 32))

func (b *burst) body(n int) []byte {
	var q strings.Builder
	fmt.Fprintf(&q, "question %d:", n)
	for i := range burstWords {
		q.WriteString(" w")
		q.WriteString(fmt.Sprint((n + i) % 997))
	}
	data, _ := json.Marshal(map[string]any{
		"model":      b.model,
		"stream":     true,
		"max_tokens": burstTokens,
		"messages": []map[string]string{
			{"role": "system", "content": systemPrompt},
			{"role": "user", "content": q.String()},
		},
	})
	return data
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
