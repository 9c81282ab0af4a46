package pipeline

import (
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
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
)

// Options tune a pipeline.
type Options struct {
	Stream       string
	Filter       string
	Consumer     string        // this aggregator's name: its floor, its ledger, its consumer's name; one process per name
	Replicas     int           // of the floor bucket, as of the streams
	PullBatch    int           // messages nats.go buffers ahead
	FlushEvery   time.Duration // how often closed windows and request events are written
	WriteTimeout time.Duration // one write attempt; a hung ClickHouse is retried, not waited on
	MaxBuffered  int           // buffered request events and unwritten rows before pulling pauses
	Clock        func() time.Time
	// Held ends once this process may no longer write for Consumer (its lease lost, see
	// package lease): the pipeline then stops as at shutdown, but writes, publishes and saves
	// nothing more. Nil: never.
	Held context.Context
}

// stage is what differs between the pipelines: tokens, feedback, and the samples' (samples.go).
type stage interface {
	// handle decodes, validates and routes one message at stream position seq, stored by
	// JetStream at stored. The message is validated as of stored, not now: a replay after
	// a restart then judges it as the first reading did (an event too far ahead of the clock
	// stays invalid however late it is read again).
	handle(data []byte, seq uint64, now, stored time.Time) (result, error)
	// cut moves every closed window (and buffered request events) into a flush.
	cut(now time.Time, seqThrough uint64) flush
	// held returns the lowest stream position still held.
	held() (uint64, bool)
	// buffered returns how many events or rows wait in memory.
	buffered() int
	// full reports whether enough waits for a flush before the next tick.
	full() bool
	// observe updates gauges; called under the lock on each flush.
	observe(now time.Time)
}

// flush is one cut: rows to write, then to publish.
type flush interface {
	empty() bool
	write(ctx context.Context, now time.Time) error
	messages() []sink.OutboxMsg // the rollups to publish once the rows are stored
	id() sink.Ledger            // the flush's place in the stream and its id
	done(now time.Time)         // the rows are stored and published: record it so a redelivery is skipped
	count() int                 // rows to write
}

type result int

const (
	resAdded result = iota
	resLate
	resSkipped
	resDuplicate // a feedback event whose event_id was already counted
)

// Pipeline consumes one stream.
type Pipeline struct {
	opts      Options
	js        jetstream.JetStream
	nc        *nats.Conn
	cons      jetstream.Consumer
	floor     *floorStore
	stage     stage
	publisher *bus.Publisher
	marks     *Watermarks // nil: no watermark published (see watermark.go)
	m         *metrics
	logger    *slog.Logger

	kick  chan struct{} // asks for a flush before the next tick
	lagAt time.Time
	// processed counts messages on the consuming goroutine, which alone touches it.
	processed uint64
	mu        sync.Mutex
	room      *sync.Cond
	lastSeq   uint64 // the last message processed
	// consumer is the server-side name of the consumer that delivered the last message; it
	// changes each time the ordered consumer starts again.
	consumer string
	savedSeq uint64 // the floor last saved
	failing  bool
	// floorFailing tells that the last save of the floor failed, so that a failure that
	// repeats is logged once. Only the goroutine that runs cycle touches it.
	floorFailing bool
	// writing is when the flush being written began, zero when none is; stallLogged tells
	// whether its stall was logged. Both are guarded by mu.
	writing     time.Time
	stallLogged bool
	// acking is when the stored flush being published began to wait for its acks, zero when
	// none is; ackLogged tells whether its stall was logged. Both are guarded by mu.
	acking    time.Time
	ackLogged bool
	// pending is a flush whose write, or the acks of whose rollups, shutdown interrupted.
	// Only the goroutine that runs cycle touches it, and outbox.
	pending *cutFlush
	outbox  outbox
	// backlog is the stream position of the last message the stream held at start, zero once
	// read (or when there was none); backlogAt is when its hold began; backlogGone tells that
	// the stream no longer holds it (expired, purged). All are guarded by mu. holds counts
	// the pipeline's holds on the watermark; only Run's goroutine touches it.
	backlog     uint64
	backlogAt   time.Time
	backlogGone bool
	holds       int
	// remade is set, for good, once the stream holds no position as high as the last
	// processed: it was made again under the running pipeline (see checkPositions), and
	// nothing it now holds is delivered until it passes that position. Guarded by mu.
	remade error
}

// resetConsumer returns an ordered consumer that delivers, in stream order, everything after
// the stored floor, and the floor and its store. The consumer acknowledges nothing (see
// FloorBucket), so nats-server never sends a message twice by itself: what sat in a
// connection that broke, or what the client dropped as a slow consumer, would be lost. The
// ordered consumer checks every message's delivery sequence and, at a gap, a missed heartbeat
// or a reconnect, recreates itself from the last stream position it handed over; the
// pipeline therefore processes every position of its filter, in order, with no hole, which
// the ledger relies on. Its server-side name is <consumer>-<random>_<n>, n counting the
// recreations.
//
// A durable consumer named o.Consumer, left by an earlier version, is deleted; one that
// acknowledged cumulatively gives its ack floor the first time.
func resetConsumer(ctx context.Context, js jetstream.JetStream, o Options) (jetstream.Consumer, uint64, *floorStore, error) {
	store, err := openFloor(ctx, js, o.Stream, o.Consumer, o.Replicas)
	if err != nil {
		return nil, 0, nil, err
	}
	floor, err := store.load(ctx)
	if err != nil {
		return nil, 0, nil, err
	}
	if c, err := js.Consumer(ctx, o.Stream, o.Consumer); err == nil {
		// An AckNone consumer's ack floor is only what it delivered: never a floor to trust.
		if info := c.CachedInfo(); info.Config.AckPolicy != jetstream.AckNonePolicy {
			floor = max(floor, info.AckFloor.Stream)
		}
		if err := js.DeleteConsumer(ctx, o.Stream, o.Consumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, 0, nil, fmt.Errorf("cannot delete the old consumer %s: %w", o.Consumer, err)
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, 0, nil, fmt.Errorf("cannot look up consumer %s on %s: %w", o.Consumer, o.Stream, err)
	}
	filter, err := consumerFilter(ctx, js, o.Stream, o.Filter)
	if err != nil {
		return nil, 0, nil, err
	}
	// A random part in the name: a consumer of a process that died lingers on the server for
	// its inactive threshold, and a new one of the same name and another start would clash.
	cc := jetstream.OrderedConsumerConfig{NamePrefix: o.Consumer + "-" + nuid.Next()}
	if filter != "" {
		cc.FilterSubjects = []string{filter}
	}
	if floor > 0 {
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	}
	cons, err := js.OrderedConsumer(ctx, o.Stream, cc)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("cannot create the consumer of %s: %w", o.Stream, err)
	}
	return cons, floor, store, nil
}

// checkPositions returns an error when a position this consumer stored, its floor or the
// highest its ledger holds, is past the last message the stream ever held. Positions only
// grow while a stream lives (a purge or an expiry keeps them), so the stream was made again
// since (a NATS store lost, the stream deleted by hand, restored from an old backup) and
// numbers its messages from 1 again: the floor would make delivery wait for a position the
// old stream had reached, and the ledger would take the new messages at old positions for
// stored ones. Either way the new events would be left out, silently.
func checkPositions(ctx context.Context, js jetstream.JetStream, o Options, floor, ledgerMax uint64) error {
	stored, what := floor, "its floor"
	if ledgerMax > stored {
		stored, what = ledgerMax, "its ledger (its rows in ClickHouse)"
	}
	if stored == 0 {
		return nil
	}
	s, err := js.Stream(ctx, o.Stream)
	if err != nil {
		return fmt.Errorf("cannot look up stream %s: %w", o.Stream, err)
	}
	if last := s.CachedInfo().State.LastSeq; stored > last {
		return fmt.Errorf("cannot resume %s as AGG_CONSUMER=%s: %s is at stream position %d, past the last message the stream has held (%d): "+
			"the stream was made again since (a NATS store lost, the stream deleted) and numbers its messages from 1 again, which would pass for stored ones; "+
			"start with a new AGG_CONSUMER (its rows add to the old ones') or make the stream again with its first sequence past %d",
			o.Stream, o.Consumer, what, stored, last, stored)
	}
	return nil
}

// consumerFilter returns the filter subject for a consumer of stream that should see the
// messages matching filter: none when filter is the stream's one subject, as it is by default
// (llm.req.> on LLM_EVENTS). nats-server then reads the next message without tokenizing and
// matching its subject against the filter, a small saving on every message delivered.
func consumerFilter(ctx context.Context, js jetstream.JetStream, stream, filter string) (string, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return "", fmt.Errorf("cannot look up stream %s: %w", stream, err)
	}
	if subjects := s.CachedInfo().Config.Subjects; len(subjects) == 1 && subjects[0] == filter {
		return "", nil
	}
	return filter, nil
}

func newPipeline(o Options, js jetstream.JetStream, nc *nats.Conn, cons jetstream.Consumer, floor uint64, store *floorStore, ob outbox, st stage, pub *bus.Publisher, m *metrics, logger *slog.Logger) *Pipeline {
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 5 * time.Minute
	}
	if o.Held == nil {
		o.Held = context.Background()
	}
	p := &Pipeline{opts: o, js: js, nc: nc, cons: cons, floor: store, stage: st, publisher: pub, outbox: ob, m: m, logger: logger, lastSeq: floor, savedSeq: floor, kick: make(chan struct{}, 1)}
	m.ackFloor.Set(float64(floor))
	p.room = sync.NewCond(&p.mu)
	return p
}

// Run publishes again the rollups the last process stored and did not see acknowledged
// (see outbox), then consumes until ctx ends, then stops pulling, writes what is closed,
// saves the floor and returns. Windows still open are above the floor: the next start
// replays them.
//
// Once o.Held ends it stops the same way, but what it holds is neither written nor published
// and the floor is not saved: another process may be counting from that floor already, and
// it reads what this one stored, as after a crash.
func (p *Pipeline) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.opts.Held, cancel)()
	defer func() {
		if p.opts.Held.Err() != nil {
			p.dropGauges()
		}
	}()
	if p.holds > 0 {
		p.m.watermarkHeld.Set(1)
	}
	if !p.replay(ctx) {
		return nil
	}
	it, err := p.cons.Messages(jetstream.PullMaxMessages(p.opts.PullBatch))
	if err != nil {
		return fmt.Errorf("cannot consume %s: %w", p.opts.Stream, err)
	}
	consumed := make(chan error, 1)
	go func() { consumed <- p.consume(ctx, it) }()
	go func() {
		<-ctx.Done()
		it.Stop()
		p.mu.Lock()
		p.room.Broadcast()
		p.mu.Unlock()
	}()
	watchDone, watchStopped := make(chan struct{}), make(chan struct{})
	defer func() {
		close(watchDone)
		<-watchStopped // before dropGauges: it sets the stall gauges
	}()
	go func() {
		p.watch(watchDone)
		close(watchStopped)
	}()
	tick := time.NewTicker(p.opts.FlushEvery)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			p.cycle(ctx)
			if now.Sub(p.lagAt) >= 10*time.Second {
				p.lagAt = now
				p.observeLag(ctx)
			}
		case <-p.kick:
			p.cycle(ctx)
		case <-ctx.Done():
			cerr := <-consumed
			final, cancel := context.WithTimeout(p.opts.Held, 15*time.Second)
			p.cycle(final) // finishes an interrupted flush, or writes what is closed
			if p.pending == nil {
				p.cycle(final) // then what is closed
			}
			cancel()
			return cerr
		}
	}
}

func (p *Pipeline) consume(ctx context.Context, it jetstream.MessagesContext) error {
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || ctx.Err() != nil {
				return nil
			}
			p.m.consumeErrors.Inc()
			continue
		}
		p.process(msg)
		if p.processed++; p.processed%256 == 0 {
			p.waitRoom(ctx)
		}
	}
}

// waitRoom pauses pulling while the memory bound is reached (ClickHouse away): JetStream
// keeps the messages, and nats.go stops asking once its buffer is full.
func (p *Pipeline) waitRoom(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stage.buffered() < p.opts.MaxBuffered {
		return
	}
	p.m.paused.Set(1)
	for p.stage.buffered() >= p.opts.MaxBuffered && ctx.Err() == nil {
		p.room.Wait()
	}
	p.m.paused.Set(0)
}

func (p *Pipeline) process(msg jetstream.Msg) {
	seq, stored, consumer, ok := ackInfo(msg)
	if !ok {
		p.m.invalid.WithLabelValues("no_metadata").Inc()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if consumer != p.consumer {
		if p.consumer != "" {
			p.m.restarts.Inc()
		}
		p.consumer = strings.Clone(consumer)
	}
	if seq <= p.lastSeq {
		// Delivered twice: a consumer acknowledging nothing should not, but the position
		// decides, not the delivery.
		p.m.redelivered.Inc()
		return
	}
	now := p.opts.Clock()
	at := now
	if stored > 0 {
		at = time.Unix(0, stored)
	}
	res, err := p.stage.handle(msg.Data(), seq, now, at)
	switch {
	case err != nil:
		p.deadLetter(msg, seq, err)
	case res == resAdded:
		p.m.added.Inc()
	case res == resLate:
		p.m.late.Inc()
	case res == resSkipped:
		p.m.skipped.Inc()
	case res == resDuplicate:
		p.m.duplicate.Inc()
	}
	p.lastSeq = seq
	if p.stage.full() {
		select { // write now rather than at the next tick, so batches stay bounded
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// deadLetter publishes an invalid message with its reason on llm.invalid and counts it.
func (p *Pipeline) deadLetter(msg jetstream.Msg, seq uint64, err error) {
	reason := events.Reason(err)
	p.m.invalid.WithLabelValues(reason).Inc()
	body := make([]byte, 0, 256+len(msg.Data()))
	body = append(body, `{"v":1,"reason":`...)
	body = events.AppendString(body, reason)
	body = append(body, `,"error":`...)
	body = events.AppendString(body, err.Error())
	body = append(body, `,"stream":`...)
	body = events.AppendString(body, p.opts.Stream)
	body = append(body, `,"stream_seq":`...)
	body = strconv.AppendUint(body, seq, 10)
	body = append(body, `,"subject":`...)
	body = events.AppendString(body, msg.Subject())
	body = append(body, `,"consumer":`...)
	body = events.AppendString(body, p.opts.Consumer)
	body = append(body, `,"data":`...)
	// Escaped, the data can take six times its size (control bytes): past the server's
	// payload limit the dead letter keeps its reason and position, and as much of the data
	// as fits, marked.
	data := msg.Data()
	const mark = `,"data_truncated":true,"data_bytes":`
	room := int(p.nc.MaxPayload()) - len(body) - len(mark) - 21
	var cut bool
	body, cut = events.AppendStringMax(body, string(data), max(room, 2))
	if cut {
		body = append(body, mark...)
		body = strconv.AppendInt(body, int64(len(data)), 10)
	}
	body = append(body, '}')
	if perr := p.nc.Publish(events.SubjectInvalid, body); perr != nil {
		p.m.deadLetterErrors.Inc()
	}
}

// cycle cuts what is closed, writes it (retrying until it is stored or ctx ends), publishes
// its rollups and waits until JetStream has them all (holding while NATS refuses), and only
// then moves the watermark and saves the floor: the position before the oldest one still
// held. Neither ever passes a rollup JetStream does not hold.
func (p *Pipeline) cycle(ctx context.Context) {
	// A flush interrupted by shutdown is finished first, alone: a later flush of the same
	// window or of later request events would record a seq_through that claims its events.
	fl := p.pending
	p.pending = nil
	var closed time.Time // the windows this cut closes, for the watermark
	caughtUp := false    // this cut takes the backlog at start through its last message
	if fl == nil {
		p.mu.Lock()
		now := p.opts.Clock()
		fl = &cutFlush{flush: p.stage.cut(now, p.lastSeq)}
		closed = p.closedThrough(now)
		caughtUp = p.backlog > 0 && (p.lastSeq >= p.backlog || p.backlogGone)
		p.stage.observe(now)
		p.mu.Unlock()
		if !fl.empty() {
			fl.seq = p.outbox.next
			p.outbox.next++
		}
	}
	if !fl.empty() {
		if !fl.stored && !p.write(ctx, fl) {
			p.pending = fl // its messages stay above the floor for the next start
			return
		}
		fl.stored = true
		if !p.publish(ctx, fl.messages()) {
			p.pending = fl // published again, same ids: JetStream drops copies
			return
		}
		p.mu.Lock()
		fl.done(p.opts.Clock())
		p.mu.Unlock()
		if len(fl.messages()) > 0 {
			p.outbox.acked = fl.seq
		}
	}
	p.advanceWatermark(closed)
	if caughtUp {
		p.releaseBacklog()
	}
	p.mu.Lock()
	floor := p.floorNow()
	p.room.Broadcast()
	p.mu.Unlock()
	p.saveMark(ctx)
	p.saveFloor(ctx, floor)
}

// stallAfter is how long a flush may take to be stored before the pipeline reports a stall.
func (p *Pipeline) stallAfter() time.Duration { return max(10*time.Second, 3*p.opts.FlushEvery) }

// watch keeps the gauges live and reports a stalled write while a flush waits for ClickHouse
// (a server that hangs rather than refuses holds one attempt for AGG_WRITE_TIMEOUT): once
// in the log, in the write_stalled_seconds gauge, and in Stalled for /readyz.
func (p *Pipeline) watch(done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		p.mu.Lock()
		now := p.opts.Clock()
		p.stage.observe(now)
		var stalled, unacked time.Duration
		if !p.writing.IsZero() {
			stalled = time.Since(p.writing)
		}
		if stalled >= p.stallAfter() && !p.stallLogged {
			p.stallLogged = true
			p.logger.Warn("a write to ClickHouse has not finished; holding the windows", "for", stalled.Round(time.Second).String(), "write_timeout", p.opts.WriteTimeout.String())
		}
		if !p.acking.IsZero() {
			unacked = time.Since(p.acking)
		}
		if unacked >= p.stallAfter() && !p.ackLogged {
			p.ackLogged = true
			p.logger.Warn("JetStream has not acknowledged a stored flush's rollups; holding the floor and the watermark", "for", unacked.Round(time.Second).String())
		}
		p.mu.Unlock()
		p.m.writeStalled.Set(stalled.Seconds())
		p.m.publishStalled.Set(unacked.Seconds())
	}
}

// dropGauges sets the gauges of what the pipeline holds to 0 once Held has ended and Run
// stops: what it held is dropped, and the process, standing by for the lease, holds nothing;
// frozen at their last values they would add to the holder's, or keep a stall alert firing.
func (p *Pipeline) dropGauges() {
	for _, g := range []prometheus.Gauge{p.m.paused, p.m.buffered, p.m.openWindows, p.m.activeKeys, p.m.watermarkDelay, p.m.lag,
		p.m.writeStalled, p.m.publishStalled, p.m.watermarkHeld} {
		g.Set(0)
	}
}

// Stalled returns an error while a flush has waited longer than the stall bound to be
// stored, or its rollups to be acknowledged by JetStream, for the readiness check.
func (p *Pipeline) Stalled(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.writing.IsZero() {
		if d := time.Since(p.writing); d >= p.stallAfter() {
			return fmt.Errorf("a write of %s to ClickHouse has not finished for %s", p.opts.Stream, d.Round(time.Second))
		}
	}
	if !p.acking.IsZero() {
		if d := time.Since(p.acking); d >= p.stallAfter() {
			return fmt.Errorf("the rollups of a stored flush of %s have waited for JetStream's acks for %s", p.opts.Stream, d.Round(time.Second))
		}
	}
	return nil
}

// publish publishes the rollups msgs of a stored flush and waits until JetStream holds every
// one: a full buffer is waited on, never dropped, and while NATS is away or refuses the
// publisher retries and this waits, as write waits for ClickHouse. It returns false when ctx
// ends (or the publisher stopped) first. A rollup JetStream refuses for good (over its size
// limit) cannot be stored by any retry: it is counted in publish_dropped_total and logged.
//
// The stall is timed from the first attempt at the flush, across the attempts of a flush
// left pending.
func (p *Pipeline) publish(ctx context.Context, msgs []sink.OutboxMsg) (ok bool) {
	if len(msgs) == 0 {
		return true
	}
	if p.stopped(ctx) {
		return false
	}
	p.mu.Lock()
	if p.acking.IsZero() {
		p.acking, p.ackLogged = time.Now(), false
	}
	p.mu.Unlock()
	defer func() {
		if !ok {
			return
		}
		p.mu.Lock()
		if p.ackLogged {
			p.logger.Info("JetStream acknowledged the held rollups", "after", time.Since(p.acking).Round(time.Second).String())
		}
		p.acking, p.ackLogged = time.Time{}, false
		p.mu.Unlock()
		p.m.publishStalled.Set(0)
	}()
	b := p.publisher.NewBatch()
	for _, m := range msgs {
		if err := b.Publish(ctx, m.Subject, m.ID, m.Data); err != nil {
			return false
		}
	}
	err := b.Wait(ctx)
	if errors.Is(err, bus.ErrRefused) {
		p.logger.Warn("JetStream refused rollups for good", "err", err)
		return true
	}
	return err == nil
}

// Unsettled reports, once Run has returned, whether it left a flush's write unfinished
// (ClickHouse away or hung at shutdown): an insert of it may still run on the server, or
// start once the server reads its socket again.
func (p *Pipeline) Unsettled() bool { return p.pending != nil && !p.pending.stored }

// stopped reports whether nothing more may be written: ctx ended, or Held did. Held is asked
// itself, right before each write: it reads the clock (see lease.Held), and a context made
// from it hears only later that it ended.
func (p *Pipeline) stopped(ctx context.Context) bool {
	return ctx.Err() != nil || p.opts.Held.Err() != nil
}

func (p *Pipeline) write(ctx context.Context, f *cutFlush) bool {
	p.mu.Lock()
	p.writing, p.stallLogged = time.Now(), false
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.stallLogged {
			p.logger.Info("the stalled write to ClickHouse finished", "after", time.Since(p.writing).Round(time.Second).String())
		}
		p.writing, p.stallLogged = time.Time{}, false
		p.mu.Unlock()
		p.m.writeStalled.Set(0)
	}()
	backoff := 100 * time.Millisecond
	for {
		if p.stopped(ctx) { // the lease lost, or shutdown's bound passed: nothing more is sent
			return false
		}
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, p.opts.WriteTimeout)
		err := p.store(wctx, f, p.opts.Clock())
		cancel()
		if err != nil && p.stopped(ctx) {
			return false
		}
		if err == nil {
			p.m.flushDuration.Observe(time.Since(start).Seconds())
			p.m.rowsWritten.Add(float64(f.count()))
			if p.failing {
				p.logger.Info("writing to ClickHouse again")
				p.failing = false
			}
			return true
		}
		p.m.flushErrors.Inc()
		if !p.failing {
			p.logger.Warn("cannot write to ClickHouse; holding the windows and retrying", "err", err)
			p.failing = true
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return false
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// observeLag reads how far the consumer is behind the stream, and whether the backlog at
// start is still in it.
func (p *Pipeline) observeLag(ctx context.Context) {
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var delivered uint64 // the stream position of the last message delivered to the pipeline
	if info, err := p.cons.Info(ictx); err == nil {
		p.m.lag.Set(float64(info.NumPending))
		delivered = info.Delivered.Stream
	}
	p.checkRemade(ictx)
	p.mu.Lock()
	backlog := p.backlog
	p.mu.Unlock()
	if backlog == 0 {
		return
	}
	// The backlog's last message deleted before it was read (past the stream's max age,
	// purged, removed by hand) never comes: the hold then waits for what the stream still
	// holds of the backlog, and for what was delivered already, and ends once both are read.
	pos, err := lastPosition(ictx, p.js, p.opts.Stream, p.opts.Filter)
	if err != nil || pos >= backlog {
		return
	}
	target := max(pos, delivered)
	p.mu.Lock()
	if p.backlog != 0 {
		if target <= p.lastSeq {
			p.backlogGone = true
		} else {
			p.backlog = target
		}
	}
	p.mu.Unlock()
}

// checkRemade reads the stream's last position and, when it is below the last message
// processed, reports for good that the stream was made again: the ordered consumer would
// wait, silently, for a position the old stream had reached, the new messages before it
// never delivered. Open windows still close and are written; /readyz fails with what to do.
func (p *Pipeline) checkRemade(ctx context.Context) {
	p.mu.Lock()
	done, processed := p.remade != nil, p.lastSeq
	p.mu.Unlock()
	if done || processed == 0 {
		return
	}
	s, err := p.js.Stream(ctx, p.opts.Stream)
	if err != nil {
		return
	}
	if last := s.CachedInfo().State.LastSeq; last < processed {
		err := fmt.Errorf("stream %s holds messages only up to position %d, below the last one processed (%d): it was made again (a NATS store lost, the stream deleted) and its new messages are not read; "+
			"restart with a new AGG_CONSUMER, or make the stream again with its first sequence past %d", p.opts.Stream, last, processed, processed)
		p.logger.Error("the stream was made again under the aggregator; its new messages are not read", "err", err)
		p.mu.Lock()
		p.remade = err
		p.mu.Unlock()
	}
}

// Remade returns, for the readiness check, an error once the stream was made again under
// the pipeline (checkRemade).
func (p *Pipeline) Remade(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.remade
}

// floorNow returns the position before the oldest one still held, or the last processed
// when nothing is held. Called under the lock.
func (p *Pipeline) floorNow() uint64 {
	if minSeq, ok := p.stage.held(); ok {
		return minSeq - 1
	}
	return p.lastSeq
}

// saveFloor stores floor when it moved. A failure is counted, and logged when the last save
// did not fail; the next cycle saves a later floor, and a start meanwhile replays more, which
// the ledger skips.
func (p *Pipeline) saveFloor(ctx context.Context, floor uint64) {
	if floor <= p.savedSeq || p.stopped(ctx) {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.floor.save(sctx, floor); err != nil {
		p.m.ackErrors.Inc()
		if !p.floorFailing {
			p.logger.Warn("cannot save the floor; the next flushes try again", "err", err)
			p.floorFailing = true
		}
		return
	}
	if p.floorFailing {
		p.logger.Info("saving the floor again", "floor", floor)
		p.floorFailing = false
	}
	p.savedSeq = floor
	p.m.ackFloor.Set(float64(floor))
}

// ackInfo reads the stream sequence, when the stream stored the message (unix ns, 0 when
// unknown) and the consumer's name from a JetStream reply subject without allocating:
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.… (or the longer form with
// domain and account hash, where they are the sixth, eighth and tenth tokens).
func ackInfo(msg jetstream.Msg) (seq uint64, stored int64, consumer string, ok bool) {
	reply := msg.Reply()
	var tokens [12]string
	n := 0
	for n < len(tokens) {
		i := strings.IndexByte(reply, '.')
		if i < 0 {
			tokens[n] = reply
			n++
			break
		}
		tokens[n] = reply[:i]
		reply = reply[i+1:]
		n++
	}
	var s, tm string
	switch {
	case n == 9:
		consumer, s, tm = tokens[3], tokens[5], tokens[7]
	case n >= 11:
		consumer, s, tm = tokens[5], tokens[7], tokens[9]
	default:
		md, err := msg.Metadata()
		if err != nil {
			return 0, 0, "", false
		}
		return md.Sequence.Stream, md.Timestamp.UnixNano(), md.Consumer, true
	}
	v, err := strconv.ParseUint(s, 10, 64)
	stored, _ = strconv.ParseInt(tm, 10, 64)
	return v, max(stored, 0), consumer, err == nil
}
