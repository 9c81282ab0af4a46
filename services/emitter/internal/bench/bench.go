package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
)

// Class is one prompt length of the benchmark.
type Class struct {
	Name        string `json:"name"`
	InputTokens int    `json:"input_tokens"`
}

// DefaultClasses are the short, medium and long prompts.
var DefaultClasses = []Class{{"short", 128}, {"medium", 1024}, {"long", 8192}}

// ParseClasses reads "short=128,medium=1024,long=8192".
func ParseClasses(s string) ([]Class, error) {
	var out []Class
	for _, part := range strings.Split(s, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		var tokens int
		if _, err := fmt.Sscan(n, &tokens); !ok || name == "" || err != nil || tokens < 1 {
			return nil, fmt.Errorf("prompt class %q is not name=tokens with tokens ≥ 1", part)
		}
		out = append(out, Class{name, tokens})
	}
	return out, nil
}

// Emitter publishes one event without blocking; emit.Emitter is one.
type Emitter interface {
	Emit(ev *events.RequestEvent, now time.Time) error
}

// Options set a benchmark run.
type Options struct {
	Client      *llmclient.Client
	Endpoint    string // for the record
	Model       string
	Classes     []Class
	Requests    int // per class
	Concurrency int
	MaxTokens   int
	Stream      bool
	Scene, Env  string
	Progress    io.Writer // the progress bar; nil for none
}

// Percentiles of one metric, in milliseconds; absent when there were no samples.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	N   int     `json:"n"`
}

// Summary is one prompt class's figures.
type Summary struct {
	Class       string      `json:"class"`
	Bucket      string      `json:"bucket"` // the input-token bucket the aggregator files these requests under
	InputTokens float64     `json:"input_tokens_mean"`
	Requests    int         `json:"requests"`
	OK          int         `json:"ok"`
	Errors      int         `json:"errors"`
	Timeouts    int         `json:"timeouts"`
	TTFT        Percentiles `json:"ttft_ms"`
	TPOT        Percentiles `json:"tpot_ms"`
	Total       Percentiles `json:"total_ms"`
}

// Result is a whole run, the JSON file bench writes and --compare reads.
type Result struct {
	Started     time.Time `json:"started"`
	Endpoint    string    `json:"endpoint"`
	Protocol    string    `json:"protocol"`
	Model       string    `json:"model"`
	Stream      bool      `json:"stream"`
	MaxTokens   int       `json:"max_tokens"`
	Concurrency int       `json:"concurrency"`
	Classes     []Summary `json:"classes"`
}

// Run benchmarks every class in turn and emits an event per request.
func Run(ctx context.Context, o Options, emit Emitter) (*Result, error) {
	if o.Requests < 1 || o.Concurrency < 1 || o.MaxTokens < 1 || len(o.Classes) == 0 {
		return nil, fmt.Errorf("cannot run a benchmark with %d requests, concurrency %d, %d max tokens and %d classes", o.Requests, o.Concurrency, o.MaxTokens, len(o.Classes))
	}
	res := &Result{Started: time.Now().UTC(), Endpoint: o.Endpoint, Protocol: o.Client.Protocol.Provider(), Model: o.Model,
		Stream: o.Stream, MaxTokens: o.MaxTokens, Concurrency: o.Concurrency}
	bar := &progress{w: o.Progress, total: o.Requests * len(o.Classes)}
	buckets := events.DefaultBucketBounds()
	for _, c := range o.Classes {
		outs := make([]llmclient.Outcome, o.Requests)
		jobs := make(chan int)
		var wg sync.WaitGroup
		for range o.Concurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					outs[i] = o.Client.Do(ctx, llmclient.Request{Model: o.Model, Prompt: llmclient.Prompt(c.InputTokens, i),
						MaxTokens: o.MaxTokens, Stream: o.Stream})
					ev := outs[i].Event(o.Model, o.Scene, o.Env, o.Client.Protocol.Provider(), "", o.Stream)
					_ = emit.Emit(ev, time.Now())
					bar.step(c.Name)
				}
			}()
		}
	send:
		for i := range o.Requests {
			select {
			case jobs <- i:
			case <-ctx.Done():
				break send
			}
		}
		close(jobs)
		wg.Wait()
		if err := ctx.Err(); err != nil {
			bar.done()
			return nil, fmt.Errorf("benchmark stopped: %w", err)
		}
		res.Classes = append(res.Classes, summarize(c, outs, buckets))
	}
	bar.done()
	return res, nil
}

func summarize(c Class, outs []llmclient.Outcome, buckets events.Buckets) Summary {
	s := Summary{Class: c.Name, Requests: len(outs)}
	var ttft, tpot, total []float64
	var in float64
	for i := range outs {
		o := &outs[i]
		switch o.Status {
		case events.StatusOK:
			s.OK++
		case events.StatusTimeout:
			s.Timeouts++
		default:
			s.Errors++
		}
		if o.Status != events.StatusOK {
			continue
		}
		var ev events.RequestEvent
		o.Result.Fill(&ev)
		in += float64(ev.InputTokens)
		ttft = append(ttft, ev.TTFTMs)
		total = append(total, ev.TotalMs)
		if v, ok := ev.TPOT(); ok {
			tpot = append(tpot, v)
		}
	}
	if s.OK > 0 {
		s.InputTokens = in / float64(s.OK)
	} else {
		s.InputTokens = float64(c.InputTokens)
	}
	s.Bucket = buckets.Label(buckets.Index(int64(s.InputTokens)))
	s.TTFT, s.TPOT, s.Total = percentiles(ttft), percentiles(tpot), percentiles(total)
	return s
}

// percentiles interpolates linearly between closest ranks, as numpy's default does.
func percentiles(v []float64) Percentiles {
	if len(v) == 0 {
		return Percentiles{}
	}
	slices.Sort(v)
	q := func(p float64) float64 {
		pos := p * float64(len(v)-1)
		lo := int(math.Floor(pos))
		hi := min(lo+1, len(v)-1)
		return v[lo] + (v[hi]-v[lo])*(pos-float64(lo))
	}
	return Percentiles{P50: q(0.50), P95: q(0.95), P99: q(0.99), N: len(v)}
}

type progress struct {
	mu    sync.Mutex
	w     io.Writer
	total int
	n     int
}

func (p *progress) step(class string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n++
	const width = 30
	fill := p.n * width / p.total
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d %-8s", strings.Repeat("#", fill), strings.Repeat(".", width-fill), p.n, p.total, class)
}

func (p *progress) done() {
	if p.w != nil {
		fmt.Fprintln(p.w)
	}
}
