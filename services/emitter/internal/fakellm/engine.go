package fakellm

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The scheduler's defaults when only some of its options are set.
const (
	defaultMaxBatch   = 256     // vLLM's max_num_seqs
	defaultKVTokens   = 1 << 20 // effectively unbounded
	defaultMaxWaiting = 4096
	prefixBlock       = 16   // tokens per prefix-cache block, vLLM's default block size
	finishedKept      = 4096 // finished requests' records kept for Finished
)

var (
	errTooLong   = errors.New("the request's prompt and output exceed the engine's KV capacity")
	errQueueFull = errors.New("the engine's queue is full")
)

// EngineRecord is what the scheduler measured of one request that ran to its end.
type EngineRecord struct {
	Queue       time.Duration // total time waiting, before the first admission and after each preemption
	TTFT        time.Duration // arrival to the first token
	Prefill     time.Duration // first admission to the first token
	Decode      time.Duration // first token to the last
	Input       int
	Output      int
	PrefixHit   int // prompt tokens found in the prefix cache
	Preemptions int
}

// seq is one request in the scheduler.
type seq struct {
	input, generated int
	blocks           []uint64 // chained hashes of the prompt's full blocks
	kv               int      // KV tokens held while running
	state            int
	admitted         chan struct{} // signalled on each admission; state is the truth
	arrived          time.Time
	queuedAt         time.Time
	scheduled        bool
	rec              EngineRecord
	firstScheduled   time.Time
	firstToken       time.Time
}

const (
	waiting = iota
	running
	done
)

// engine models an inference engine's scheduler: at most maxBatch requests run at once,
// their prompt and generated tokens share kvCap KV tokens, the rest wait in a FIFO queue.
// When a running request cannot grow, the newest running one is preempted: it frees its
// KV, goes back to the front of the queue and recomputes its tokens when admitted again,
// as vLLM's v1 scheduler does. Every method takes the lock; times come from now.
type engine struct {
	maxBatch, kvCap, maxWaiting int
	now                         func() time.Time
	prefix                      *prefixCache // nil when off

	mu       sync.Mutex
	waiting  []*seq
	running  []*seq // in admission order: the last is the newest
	kvUsed   int
	finished []EngineRecord // ring of the last finishedKept
	next     int
	m        *engineMetrics
}

func newEngine(opts Options, reg prometheus.Registerer) *engine {
	e := &engine{maxBatch: opts.MaxBatch, kvCap: opts.KVTokens, maxWaiting: opts.MaxWaiting, now: opts.Now}
	if e.maxBatch <= 0 {
		e.maxBatch = defaultMaxBatch
	}
	if e.kvCap <= 0 {
		e.kvCap = defaultKVTokens
	}
	if e.maxWaiting <= 0 {
		e.maxWaiting = defaultMaxWaiting
	}
	if e.now == nil {
		e.now = time.Now
	}
	if opts.PrefixCache {
		e.prefix = newPrefixCache(max(e.kvCap/prefixBlock, 1))
	}
	model := opts.ModelName
	if model == "" {
		model = "fake-model"
	}
	e.m = newEngineMetrics(reg, e, prometheus.Labels{"model_name": model, "engine": "0"})
	return e
}

// submit queues s, or says why it never can run.
func (e *engine) submit(s *seq, output int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.input+output > e.kvCap {
		return fmt.Errorf("%w: %d prompt and %d output tokens, %d KV tokens", errTooLong, s.input, output, e.kvCap)
	}
	if len(e.waiting) >= e.maxWaiting {
		return fmt.Errorf("%w: %d requests waiting", errQueueFull, len(e.waiting))
	}
	now := e.now()
	s.admitted = make(chan struct{}, 1)
	s.arrived, s.queuedAt, s.state = now, now, waiting
	s.rec.Input = s.input
	e.waiting = append(e.waiting, s)
	e.schedule(now)
	return nil
}

// schedule admits from the head of the queue while a slot and the head's KV are free;
// a head that does not fit blocks those behind it, as in vLLM.
func (e *engine) schedule(now time.Time) {
	for len(e.waiting) > 0 && len(e.running) < e.maxBatch {
		s := e.waiting[0]
		need := s.input + s.generated
		if e.kvUsed+need > e.kvCap {
			return
		}
		e.waiting = e.waiting[1:]
		s.state, s.kv = running, need
		e.kvUsed += need
		e.running = append(e.running, s)
		s.rec.Queue += now.Sub(s.queuedAt)
		if !s.scheduled {
			s.scheduled, s.firstScheduled = true, now
			e.m.promptTokens.Add(float64(s.input))
			if e.prefix != nil {
				s.rec.PrefixHit = e.prefix.lookup(s.blocks)
				e.m.prefixQueries.Add(float64(s.input))
				e.m.prefixHits.Add(float64(s.rec.PrefixHit))
			}
		}
		select {
		case s.admitted <- struct{}{}:
		default:
		}
	}
}

// wait blocks until s is admitted or ctx ends.
func (e *engine) wait(ctx context.Context, s *seq) bool {
	select {
	case <-s.admitted:
		return true
	case <-ctx.Done():
		return false
	}
}

// grow gives s its next token's KV slot, preempting the newest running requests while
// the cache is full. It reports false when s is not running (preempted now or before).
func (e *engine) grow(s *seq) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.state != running {
		return false
	}
	now := e.now()
	for e.kvUsed+1 > e.kvCap {
		victim := e.running[len(e.running)-1]
		e.preempt(victim, now)
		if victim == s {
			return false
		}
	}
	s.generated++
	s.kv++
	e.kvUsed++
	e.m.generationTokens.Inc()
	if s.generated == 1 && s.firstToken.IsZero() {
		s.firstToken = now
		s.rec.TTFT = now.Sub(s.arrived)
		e.m.ttft.Observe(s.rec.TTFT.Seconds())
	}
	return true
}

func (e *engine) preempt(s *seq, now time.Time) {
	e.running = e.running[:len(e.running)-1]
	e.kvUsed -= s.kv
	s.kv, s.state, s.queuedAt = 0, waiting, now
	s.rec.Preemptions++
	e.waiting = slices.Insert(e.waiting, 0, s)
	e.m.preemptions.Inc()
}

// finish ends s after its last token, records it and returns the record.
func (e *engine) finish(s *seq) EngineRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	e.remove(s)
	if s.rec.Output = s.generated; !s.firstToken.IsZero() {
		s.rec.Prefill = s.firstToken.Sub(s.firstScheduled)
		s.rec.Decode = now.Sub(s.firstToken)
	}
	e.m.queue.Observe(s.rec.Queue.Seconds())
	e.m.prefill.Observe(s.rec.Prefill.Seconds())
	e.m.decode.Observe(s.rec.Decode.Seconds())
	if len(e.finished) < finishedKept {
		e.finished = append(e.finished, s.rec)
	} else {
		e.finished[e.next] = s.rec
		e.next = (e.next + 1) % finishedKept
	}
	e.schedule(now)
	return s.rec
}

// abort drops s, wherever it is, when its client left or its stream was cut.
func (e *engine) abort(s *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.remove(s)
	e.schedule(e.now())
}

func (e *engine) remove(s *seq) {
	switch s.state {
	case waiting:
		if i := slices.Index(e.waiting, s); i >= 0 {
			e.waiting = slices.Delete(e.waiting, i, i+1)
		}
	case running:
		if i := slices.Index(e.running, s); i >= 0 {
			e.running = slices.Delete(e.running, i, i+1)
		}
		e.kvUsed -= s.kv
		s.kv = 0
	}
	s.state = done
}

// prefillTime is how long s computes its prompt once admitted: the first time less the
// tokens found in the prefix cache, after a preemption the prompt and its tokens so far.
func (e *engine) prefillTime(p *plan, s *seq, per1K time.Duration) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	d := p.ttft + time.Duration(int64(per1K)*int64(s.generated)/1000)
	if s.rec.Preemptions == 0 {
		d = p.ttft - time.Duration(int64(per1K)*int64(s.rec.PrefixHit)/1000)
	}
	return max(d, 0)
}

// state is the scheduler's gauges.
func (e *engine) state() (running, waiting int, kvUsage float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.running), len(e.waiting), float64(e.kvUsed) / float64(e.kvCap)
}

// Finished returns the records of the last requests that ran to their end, oldest first.
func (e *engine) records() []EngineRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append(slices.Clone(e.finished[e.next:]), e.finished[:e.next]...)
}

// prefixCache holds the hashes of the prompt blocks computed lately, least recently used
// evicted first, as vLLM keeps freed blocks reusable until it needs their space.
type prefixCache struct {
	cap   int
	order *list.List
	at    map[uint64]*list.Element
}

func newPrefixCache(blocks int) *prefixCache {
	return &prefixCache{cap: blocks, order: list.New(), at: map[uint64]*list.Element{}}
}

// lookup returns the prompt tokens of the longest cached run of leading blocks, and
// caches all of blocks.
func (c *prefixCache) lookup(blocks []uint64) int {
	hit, missed := 0, false
	for _, b := range blocks {
		if el, ok := c.at[b]; ok {
			c.order.MoveToFront(el)
			if !missed {
				hit += prefixBlock
			}
			continue
		}
		missed = true
		c.at[b] = c.order.PushFront(b)
		if c.order.Len() > c.cap {
			old := c.order.Back()
			c.order.Remove(old)
			delete(c.at, old.Value.(uint64))
		}
	}
	return hit
}

// blockHashes chains the hashes of each full block of prefixBlock words, so that a block
// matches only when everything before it matches too.
func blockHashes(model string, words []string) []uint64 {
	var out []uint64
	h := fnv.New64a()
	_, _ = h.Write([]byte(model))
	for i := 0; i+prefixBlock <= len(words); i += prefixBlock {
		for _, w := range words[i : i+prefixBlock] {
			_, _ = h.Write([]byte(w))
			_, _ = h.Write([]byte{0})
		}
		out = append(out, h.Sum64())
	}
	return out
}

// engineMetrics are vLLM's v1 engine metrics under its names and labels.
type engineMetrics struct {
	promptTokens, generationTokens, prefixQueries, prefixHits, preemptions prometheus.Counter
	queue, ttft, prefill, decode                                           prometheus.Histogram
}

// vLLM's bucket boundaries.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
		20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
		120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

func newEngineMetrics(reg prometheus.Registerer, e *engine, labels prometheus.Labels) *engineMetrics {
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}
	gauge := func(name, help string, f func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func() float64 { r, _, _ := e.state(); return float64(r) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func() float64 { _, w, _ := e.state(); return float64(w) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func() float64 { _, _, u := e.state(); return u })
	return &engineMetrics{
		promptTokens:     counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generationTokens: counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries:    counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:       counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		preemptions:      counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		queue:            histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets),
		ttft:             histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		prefill:          histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", requestLatencyBuckets),
		decode:           histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", requestLatencyBuckets),
	}
}
