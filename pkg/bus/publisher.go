package bus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// PublisherOptions tune a Publisher; zero values take the defaults.
type PublisherOptions struct {
	Buffer       int           // messages held, queued or unacknowledged, while NATS is slow or away (default 100,000)
	BufferBytes  int64         // bytes those messages hold, subjects and ids included (default 128 MiB)
	Batch        int           // messages published and not yet acknowledged at any time (default 4,096)
	AckTimeout   time.Duration // how long to wait for JetStream's ack before publishing again (default 5s)
	FlushTimeout time.Duration // how long Run keeps publishing after its context ends (default 5s)
	// Linger is how long the first message into an empty queue waits for others before
	// Run publishes (0: at once). A publish costs a few goroutine hand-offs, the client's
	// flusher and the ack's reader included: lingering pays them once for all the messages of
	// the while, where a trickle of messages would pay them for each.
	Linger    time.Duration
	Namespace string // metric namespace, such as "emitter"
}

// Client is what a Publisher needs of its NATS client; jetstream.JetStream is one.
type Client interface {
	Conn() *nats.Conn
}

// Publisher publishes to JetStream without ever blocking or failing its callers: Publish
// queues a message in a bounded buffer and returns at once; Run publishes the queue with a
// window of Batch messages awaiting their acks, and publishes again, after a backoff, what
// JetStream refused or did not acknowledge in AckTimeout (each message carries a
// Nats-Msg-Id, so a retry can never count twice). When the buffer is full the new message
// is dropped and counted; so is what is still held when Run gives up at shutdown, and
// whatever is published after Run returned. A caller that must know its messages are
// stored publishes them through a Batch instead, which waits for room and for the acks.
//
// It publishes with core NATS and a reply subject of its own, and reads the acks in one
// subscription, instead of the client library's asynchronous publish: that saves a future,
// a timer and a JSON decoding per message, a quarter of the CPU an event costs the client
// and the server together (BenchmarkJetStreamCeiling).
type Publisher struct {
	nc     *nats.Conn
	opts   PublisherOptions
	logger *slog.Logger
	wake   chan struct{} // one token: the queue went from empty to not empty
	flush  chan struct{} // one token: a Batch waits, so what is queued goes without lingering

	mu      sync.Mutex
	queue   fifo          // published, not yet taken by Run
	held    int           // queued, or taken by Run and not yet acknowledged or dropped
	bytes   int64         // what the held messages hold (outMsg.size)
	stopped bool          // Run returned: Publish drops
	room    chan struct{} // made by a Batch waiting for room, closed when room is freed
	done    chan struct{} // closed when Run returns

	published prometheus.Counter
	duplicate prometheus.Counter
	dropped   prometheus.Counter
	retried   prometheus.Counter
	buffered  prometheus.GaugeFunc
	bufBytes  prometheus.GaugeFunc
}

type outMsg struct {
	subject, id string
	data        []byte
	batch       *Batch // nil: nobody waits for its ack
}

// size is what m counts against PublisherOptions.BufferBytes.
func (m *outMsg) size() int64 { return int64(len(m.subject) + len(m.id) + len(m.data)) }

// NewPublisher returns a Publisher on js's connection whose metrics are registered on reg.
func NewPublisher(js Client, opts PublisherOptions, reg prometheus.Registerer, logger *slog.Logger) *Publisher {
	if opts.Buffer <= 0 {
		opts.Buffer = 100_000
	}
	if opts.BufferBytes <= 0 {
		opts.BufferBytes = 128 << 20
	}
	if opts.Batch <= 0 {
		opts.Batch = 4096
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = 5 * time.Second
	}
	if opts.FlushTimeout <= 0 {
		opts.FlushTimeout = 5 * time.Second
	}
	p := &Publisher{nc: js.Conn(), opts: opts, logger: logger, wake: make(chan struct{}, 1), flush: make(chan struct{}, 1), done: make(chan struct{})}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: opts.Namespace, Name: name, Help: help})
	}
	p.published = counter("published_total", "Messages JetStream acknowledged.")
	p.duplicate = counter("published_duplicate_total", "Messages JetStream dropped as duplicates of an earlier Nats-Msg-Id (including a retry whose first attempt had landed unacknowledged).")
	p.dropped = counter("publish_dropped_total", "Messages dropped because the publish buffer was full (NATS away too long: its messages or its bytes), the service stopped before NATS took them, or NATS refuses them for good (over its payload limit).")
	p.retried = counter("publish_retried_total", "Publish attempts that failed or were not acknowledged in time, and were retried.")
	p.buffered = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: opts.Namespace, Name: "publish_buffered_messages", Help: "Messages waiting to be published or acknowledged."},
		func() float64 { return float64(p.Buffered()) })
	p.bufBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: opts.Namespace, Name: "publish_buffered_bytes", Help: "Bytes the messages waiting to be published or acknowledged hold."},
		func() float64 { return float64(p.BufferedBytes()) })
	if reg != nil {
		reg.MustRegister(p.published, p.duplicate, p.dropped, p.retried, p.buffered, p.bufBytes)
	}
	return p
}

// Publish queues data for subject with msgID as its Nats-Msg-Id. It never blocks: it
// returns false, and counts a drop, when the buffer is full (of messages or of bytes) or Run
// has returned. data must not change afterwards, and the buffer holds no more than what it
// counts only when subject, msgID and data share their memory with nothing larger.
func (p *Publisher) Publish(subject, msgID string, data []byte) bool {
	m := outMsg{subject: subject, id: msgID, data: data}
	p.mu.Lock()
	if p.stopped || p.held >= p.opts.Buffer || p.bytes+m.size() > p.opts.BufferBytes {
		p.mu.Unlock()
		p.dropped.Inc()
		return false
	}
	p.enqueue(m)
	return true
}

// enqueue queues m, with p.mu held, and unlocks it; it wakes Run when the queue was empty.
func (p *Publisher) enqueue(m outMsg) {
	p.queue.push(m)
	p.held++
	p.bytes += m.size()
	first := p.queue.len() == 1
	p.mu.Unlock()
	if first {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// ErrRefused is returned by Batch.Wait when JetStream refused messages of the batch for
// good (over the payload limit, a bad subject): no retry can store them.
var ErrRefused = errors.New("refused for good")

// ErrStopped is returned by a Batch once the Publisher's Run has returned: what it still
// held is not published.
var ErrStopped = errors.New("the publisher stopped")

// Batch is a set of messages whose acknowledgements a caller waits for: a caller that must
// not move on before JetStream has stored what it published (the aggregator saves its replay
// floor only past rollups JetStream holds) publishes through a Batch and calls Wait.
type Batch struct {
	p       *Publisher
	mu      sync.Mutex
	pending int           // queued and not yet acknowledged or refused
	refused int           // refused for good
	zero    chan struct{} // made by Wait, closed once pending is 0
}

// NewBatch returns an empty batch publishing through p.
func (p *Publisher) NewBatch() *Batch { return &Batch{p: p} }

// Publish queues data for subject with msgID as its Nats-Msg-Id, as Publisher.Publish does,
// but never drops it: while the buffer is full it waits for room (a message larger than the
// whole buffer waits for an empty one). It fails only when ctx ends or Run has returned.
func (b *Batch) Publish(ctx context.Context, subject, msgID string, data []byte) error {
	p := b.p
	m := outMsg{subject: subject, id: msgID, data: data, batch: b}
	for {
		p.mu.Lock()
		if p.stopped {
			p.mu.Unlock()
			return fmt.Errorf("cannot publish on %s: %w", subject, ErrStopped)
		}
		if p.held == 0 || (p.held < p.opts.Buffer && p.bytes+m.size() <= p.opts.BufferBytes) {
			b.mu.Lock()
			b.pending++
			b.mu.Unlock()
			p.enqueue(m)
			return nil
		}
		if p.room == nil {
			p.room = make(chan struct{})
		}
		room := p.room
		p.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return fmt.Errorf("cannot publish on %s: the buffer stayed full: %w", subject, ctx.Err())
		}
	}
}

// Wait returns once JetStream has acknowledged every message published in b, which it
// publishes without Linger (a duplicate
// of an earlier Nats-Msg-Id counts as acknowledged), or refused it for good: then the error
// wraps ErrRefused and says how many. While NATS is away or refuses for now, the Publisher
// retries and Wait waits, until ctx ends or Run returns (ErrStopped).
func (b *Batch) Wait(ctx context.Context) error {
	b.mu.Lock()
	if b.pending == 0 {
		b.mu.Unlock()
		return b.result()
	}
	if b.zero == nil {
		b.zero = make(chan struct{})
	}
	zero := b.zero
	b.mu.Unlock()
	select {
	case b.p.flush <- struct{}{}:
	default:
	}
	select {
	case <-zero:
		return b.result()
	case <-ctx.Done():
		return fmt.Errorf("cannot wait for JetStream's acks of %d messages: %w", b.Pending(), ctx.Err())
	case <-b.p.done:
		if n := b.Pending(); n > 0 {
			return fmt.Errorf("%d messages unacknowledged: %w", n, ErrStopped)
		}
		return b.result()
	}
}

// Pending returns how many messages of b wait for their ack.
func (b *Batch) Pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending
}

func (b *Batch) result() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refused > 0 {
		return fmt.Errorf("JetStream refused %d messages: %w", b.refused, ErrRefused)
	}
	return nil
}

// settle records that one message of b was acknowledged, or refused for good. b may be nil.
func (b *Batch) settle(refused bool) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.pending--
	if refused {
		b.refused++
	}
	if b.pending == 0 && b.zero != nil {
		close(b.zero)
		b.zero = nil
	}
	b.mu.Unlock()
}

// Buffered returns how many messages wait to be published or acknowledged.
func (p *Publisher) Buffered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// BufferedBytes returns what the messages waiting to be published or acknowledged hold.
func (p *Publisher) BufferedBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// Run publishes until ctx ends, then keeps publishing what is held for up to FlushTimeout
// and counts the rest as dropped.
func (p *Publisher) Run(ctx context.Context) error {
	s, err := p.newSender()
	if err != nil {
		p.stop(0)
		return err
	}
	defer func() { _ = s.sub.Unsubscribe() }()
	tick := time.NewTicker(min(50*time.Millisecond, p.opts.AckTimeout/4))
	defer tick.Stop()
	// Armed by a wake-up when lingering: the queue is taken when it fires.
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	defer linger.Stop()
	lingering := false
	var deadline time.Time // set once ctx ends
	done := ctx.Done()
	for {
		s.send(time.Now())
		if !deadline.IsZero() && p.Buffered() == 0 {
			p.stop(0)
			return nil
		}
		select {
		case m := <-s.acks:
			s.ack(m)
			for n := len(s.acks); n > 0; n-- {
				s.ack(<-s.acks)
			}
			s.settle()
			if !lingering {
				s.take()
			}
		case <-p.wake:
			if p.opts.Linger > 0 && deadline.IsZero() {
				if !lingering {
					lingering = true
					linger.Reset(p.opts.Linger)
				}
				continue
			}
			s.take()
		case <-linger.C:
			lingering = false
			s.take()
		case <-p.flush:
			// Someone waits for the acks: lingering would only delay them.
			if lingering {
				linger.Stop()
				lingering = false
			}
			s.take()
		case now := <-tick.C:
			if !lingering {
				s.take() // messages queued while the window was full
			}
			s.expire(now)
			if !deadline.IsZero() && now.After(deadline) {
				lost := p.stop(s.abandon())
				return fmt.Errorf("stopped with %d messages unpublished: NATS did not take them in %s", lost, p.opts.FlushTimeout)
			}
		case <-done:
			deadline, done, lingering = time.Now().Add(p.opts.FlushTimeout), nil, false
			s.take()
		}
	}
}

// stop makes Publish drop from now on and drops what is still held, plus abandoned, which
// Run had taken; it returns how many were dropped.
func (p *Publisher) stop(abandoned int) int {
	p.mu.Lock()
	if !p.stopped {
		close(p.done)
	}
	p.stopped = true
	if p.room != nil {
		close(p.room)
		p.room = nil
	}
	lost := p.queue.len() + abandoned
	p.held -= lost
	p.bytes = 0 // nothing is held any more, and nothing will be
	p.queue.reset()
	p.mu.Unlock()
	p.dropped.Add(float64(lost))
	return lost
}

// sender is Run's state; only Run's goroutine touches it.
type sender struct {
	p      *Publisher
	sub    *nats.Subscription
	acks   chan *nats.Msg
	prefix string // reply subject up to the token: "<inbox>."

	ready    fifo // taken from the queue, not yet published
	retry    fifo // refused or unacknowledged, published again after the backoff
	inflight map[uint64]flight
	order    []uint64 // tokens in the order published, from head on: order[head] is the oldest unacknowledged
	head     int
	next     uint64 // token of the next publish; each attempt gets a new one

	settled  int   // acknowledged or dropped since the last settle
	freed    int64 // their bytes
	backoff  time.Duration
	until    time.Time // no publishing before it
	failing  bool      // logged that publishing fails
	msg      nats.Msg  // reused for every publish: PublishMsg copies what it needs
	reply    []byte
	idHeader []string
}

type flight struct {
	m    outMsg
	sent time.Time
}

func (p *Publisher) newSender() (*sender, error) {
	s := &sender{p: p, acks: make(chan *nats.Msg, 2*p.opts.Batch+1024), inflight: make(map[uint64]flight, p.opts.Batch),
		prefix: p.nc.NewInbox() + ".", idHeader: make([]string, 1), next: 1}
	s.msg.Header = nats.Header{jetstream.MsgIDHeader: s.idHeader}
	sub, err := p.nc.ChanSubscribe(s.prefix+"*", s.acks)
	if err != nil {
		return nil, fmt.Errorf("cannot subscribe to JetStream acks: %w", err)
	}
	s.sub = sub
	return s, nil
}

// take moves what callers queued into ready, unless ready has enough for the window.
func (s *sender) take() {
	if s.ready.len() >= s.p.opts.Batch {
		return
	}
	p := s.p
	p.mu.Lock()
	p.queue.moveTo(&s.ready)
	p.mu.Unlock()
}

// send publishes retries, then ready messages, while the window has room, the backoff is
// over and the connection is up: while NATS is away nothing piles up in the client's
// reconnect buffer, so a message is never sent twice for the one outage.
func (s *sender) send(now time.Time) {
	room := s.p.opts.Batch - len(s.inflight)
	if room <= 0 || now.Before(s.until) || (s.retry.len() == 0 && s.ready.len() == 0) || !s.p.nc.IsConnected() {
		return
	}
	// A failed publish sets a backoff, which stops the rest.
	for ; room > 0 && s.retry.len() > 0 && !now.Before(s.until); room-- {
		s.publish(s.retry.pop(), now)
	}
	for ; room > 0 && s.ready.len() > 0 && !now.Before(s.until); room-- {
		s.publish(s.ready.pop(), now)
	}
	s.settle()
}

func (s *sender) publish(m outMsg, now time.Time) {
	tok := s.next
	s.next++
	s.reply = strconv.AppendUint(append(s.reply[:0], s.prefix...), tok, 10)
	s.msg.Subject, s.msg.Reply, s.msg.Data = m.subject, string(s.reply), m.data
	s.idHeader[0] = m.id
	err := s.p.nc.PublishMsg(&s.msg)
	switch {
	case err == nil:
		s.inflight[tok] = flight{m: m, sent: now}
		s.order = append(s.order, tok)
	case errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject):
		// No retry can succeed: drop it, counted and said.
		s.p.dropped.Inc()
		s.settled++
		s.freed += m.size()
		m.batch.settle(true)
		s.p.logger.Warn("dropped a message NATS can never take", "subject", m.subject, "err", err)
	default:
		s.fail(m, now)
	}
}

// ack settles the message whose token ends m's subject. An ack of an attempt already
// given up (expired and published again) is ignored: its message still has a newer one.
func (s *sender) ack(m *nats.Msg) {
	tok, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, s.prefix), 10, 64)
	f, ok := s.inflight[tok]
	if err != nil || !ok {
		return
	}
	delete(s.inflight, tok)
	s.popAcked()
	errAt := jsonKey(m.Data, "error")
	switch {
	case len(m.Data) == 0: // a status: 503, no stream takes the subject (yet)
		s.fail(f.m, time.Now())
		return
	case errAt >= 0 && refusedForGood(m.Data[errAt:]):
		s.p.dropped.Inc()
		f.m.batch.settle(true)
		s.p.logger.Warn("dropped a message JetStream refuses", "subject", f.m.subject, "err", string(m.Data))
	case errAt >= 0:
		s.fail(f.m, time.Now())
		return
	case isTrue(m.Data, jsonKey(m.Data, "duplicate")):
		s.p.duplicate.Inc()
		f.m.batch.settle(false)
	default:
		s.p.published.Inc()
		f.m.batch.settle(false)
	}
	s.settled++
	s.freed += f.m.size()
	if s.failing && s.retry.len() == 0 {
		s.p.logger.Info("publishing to NATS again")
		s.failing, s.backoff = false, 0
	}
}

// jsonKey returns the offset of the value of key in the JSON object data, or -1. The
// server writes its acks by hand or with encoding/json; the only nesting is "error"'s
// object. A quoted name inside a string would be escaped, so the name in quotes followed by
// a colon is the key.
func jsonKey(data []byte, key string) int {
	var q [32]byte
	quoted := append(append(append(q[:0], '"'), key...), '"')
	for from := 0; ; {
		i := bytes.Index(data[from:], quoted)
		if i < 0 {
			return -1
		}
		i = skipSpace(data, from+i+len(quoted))
		if i < len(data) && data[i] == ':' {
			return skipSpace(data, i+1)
		}
		from = i
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// refusedForGood reports whether the error object of an ack says no retry can succeed:
// a 4xx code (the message is too large, its headers are wrong) other than 408 (timeout) and
// 429 (too many requests). 5xx (storage failed, no resources, no leader) are retried.
func refusedForGood(errObj []byte) bool {
	at := jsonKey(errObj, "code")
	if at < 0 || at+3 > len(errObj) || errObj[at] != '4' {
		return false
	}
	code := string(errObj[at : at+3])
	return code != "408" && code != "429"
}

func isTrue(data []byte, at int) bool {
	return at >= 0 && bytes.HasPrefix(data[at:], []byte("true"))
}

// popAcked moves head past acknowledged tokens.
func (s *sender) popAcked() {
	for s.head < len(s.order) {
		if _, ok := s.inflight[s.order[s.head]]; ok {
			break
		}
		s.head++
	}
	s.compact()
}

// compact moves the tokens from head on to the start of order once half of it is spent.
func (s *sender) compact() {
	if s.head == len(s.order) {
		s.order, s.head = s.order[:0], 0
	} else if s.head >= 1024 && 2*s.head >= len(s.order) {
		s.order, s.head = s.order[:copy(s.order, s.order[s.head:])], 0
	}
}

// expire gives up waiting for the acks of messages published AckTimeout ago or earlier and
// publishes them again: the Nats-Msg-Id makes a late success of the first attempt harmless.
func (s *sender) expire(now time.Time) {
	cut := now.Add(-s.p.opts.AckTimeout)
	for ; s.head < len(s.order); s.head++ {
		tok := s.order[s.head]
		f, ok := s.inflight[tok]
		if !ok {
			continue
		}
		if f.sent.After(cut) {
			break
		}
		delete(s.inflight, tok)
		s.fail(f.m, now)
	}
	s.compact()
	s.settle()
}

// fail puts m back for a retry after a backoff that doubles while failures go on.
func (s *sender) fail(m outMsg, now time.Time) {
	s.retry.push(m)
	s.p.retried.Inc()
	if now.Before(s.until) {
		return
	}
	s.backoff = min(max(2*s.backoff, 50*time.Millisecond), 2*time.Second)
	s.until = now.Add(s.backoff)
	if !s.failing {
		s.p.logger.Warn("cannot publish to NATS; buffering and retrying", "buffered", s.p.Buffered())
		s.failing = true
	}
}

// settle releases the buffer room of what was acknowledged or dropped.
func (s *sender) settle() {
	if s.settled == 0 {
		return
	}
	s.p.mu.Lock()
	s.p.held -= s.settled
	s.p.bytes -= s.freed
	if s.p.room != nil {
		close(s.p.room)
		s.p.room = nil
	}
	s.p.mu.Unlock()
	s.settled, s.freed = 0, 0
}

// abandon forgets everything Run holds and returns how many messages that was.
func (s *sender) abandon() int {
	n := s.ready.len() + s.retry.len() + len(s.inflight)
	s.ready.reset()
	s.retry.reset()
	s.order, s.head = nil, 0
	clear(s.inflight)
	return n
}

// fifo is a queue of messages in blocks: it grows without copying what it holds, a whole
// queue moves to another in a few pointer copies, and spent blocks are reused.
type fifo struct {
	blocks []*block
	head   int // the next message is blocks[0].msgs[head]
	n      int
}

const blockLen = 512

type block struct {
	msgs [blockLen]outMsg
	n    int
}

var blocks = sync.Pool{New: func() any { return new(block) }}

func (f *fifo) len() int { return f.n }

func (f *fifo) push(m outMsg) {
	if len(f.blocks) == 0 || f.blocks[len(f.blocks)-1].n == blockLen {
		f.blocks = append(f.blocks, blocks.Get().(*block))
	}
	b := f.blocks[len(f.blocks)-1]
	b.msgs[b.n] = m
	b.n++
	f.n++
}

func (f *fifo) pop() outMsg {
	b := f.blocks[0]
	m := b.msgs[f.head]
	b.msgs[f.head] = outMsg{} // let go of the payload
	f.head++
	f.n--
	if f.head == b.n {
		f.head = 0
		if len(f.blocks) == 1 {
			b.n = 0 // keep the last block for the next push
		} else {
			b.n = 0
			blocks.Put(b)
			f.blocks[0] = nil
			f.blocks = f.blocks[1:]
		}
	}
	return m
}

// moveTo appends f's messages to dst and empties f. A fifo never popped (head 0, as the
// queue) moves by its blocks: pop takes blocks that are not full in its stride, and pushes
// go to the last block only.
func (f *fifo) moveTo(dst *fifo) {
	if f.n == 0 {
		return
	}
	if f.head != 0 {
		for f.n > 0 {
			dst.push(f.pop())
		}
		return
	}
	if dst.n == 0 {
		dst.reset() // its first block may be an empty one kept for pushes
	}
	dst.blocks = append(dst.blocks, f.blocks...)
	dst.n += f.n
	clear(f.blocks)
	f.blocks, f.n = f.blocks[:0], 0
}

// reset empties f, letting go of the payloads.
func (f *fifo) reset() {
	for _, b := range f.blocks {
		clear(b.msgs[:b.n])
		b.n = 0
		blocks.Put(b)
	}
	clear(f.blocks)
	f.blocks, f.head, f.n = f.blocks[:0], 0, 0
}
