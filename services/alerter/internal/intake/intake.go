package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/deadletter"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
)

// Evaluator is what the intake feeds; *engine.Engine is one.
type Evaluator interface {
	Evaluate(w engine.Window) []events.Alert
}

// Sink delivers a window's alert state changes; *notify.Notifier is one. Publish returns
// nil only once JetStream has acknowledged every alert (publishing the same alerts again is
// harmless: their Nats-Msg-Id makes JetStream drop the copies). Their rows are written
// from the ALERTS stream (package record).
type Sink interface {
	Publish(ctx context.Context, alerts []events.Alert) error
}

// Checkpoint durably records the start of the latest window whose alerts are delivered;
// *checkpoint.KV is one.
type Checkpoint interface {
	Save(ctx context.Context, windowStart time.Time) error
}

// DeadLetter takes a message no consumer can use; a *nats.Conn is one.
type DeadLetter = deadletter.Publisher

// Options tune the intake.
type Options struct {
	Settle time.Duration // quiet time after a window's last rollup before it is evaluated
	Tick   time.Duration // how often ready windows are looked for (default 1 s)
	// Evaluated is the checkpoint read at start: windows starting at or before it were
	// evaluated and delivered by an earlier run, so their rollups, delivered again, are
	// acknowledged without being evaluated twice.
	Evaluated time.Time
	// Replayed is the last stream sequence the consumer had delivered before it was reset
	// (see ResumeConsumer): a rollup up to it of a window already evaluated is a
	// redelivery, not a late rollup.
	Replayed uint64
	// AttemptTimeout bounds one checkpoint save (default 10 s).
	AttemptTimeout time.Duration
	// WatermarkTimeout bounds how long past Settle a window waits for an aggregator whose
	// watermark has not passed it (0: windows wait for no watermark).
	WatermarkTimeout time.Duration
	// ShutdownTimeout is how long, once Run's context ends, the window being delivered and
	// the windows already settled may take to be delivered (default 10 s).
	ShutdownTimeout time.Duration
	// Reopen makes the consumer again when it stops delivering (deleted, or its stream
	// deleted and made again), reading from stream sequence from (0: as it was made at
	// start); seen is the highest sequence read. It reports whether the stream is another
	// one, whose sequences start again (*Reopener.Reopen is one). Without it Run returns an
	// error when its consumer is gone.
	Reopen func(ctx context.Context, from, seen uint64) (jetstream.Consumer, bool, error)
}

// The reasons a rollup is not evaluated.
const (
	reasonMalformed   = "malformed"
	reasonInvalid     = "invalid"
	reasonSubject     = "unknown_subject"
	reasonLate        = "late"
	reasonRedelivered = "redelivered"
	reasonDuplicate   = "duplicate" // a rollup stored twice under one Nats-Msg-Id
	reasonCorrection  = "correction"
	reasonUnread      = "not_evaluated" // a kind no rule reads: host rollups
)

var reasons = []string{reasonMalformed, reasonInvalid, reasonSubject, reasonLate, reasonRedelivered, reasonDuplicate, reasonCorrection, reasonUnread}

// The steps of delivering an evaluated window, for errors and logs.
const (
	stepPublish    = "publish"
	stepCheckpoint = "checkpoint"
)

// Intake gathers windows and has them evaluated and delivered, from one goroutine (Run).
type Intake struct {
	cons   jetstream.Consumer
	eval   Evaluator
	sink   Sink
	cp     Checkpoint
	dead   DeadLetter
	opts   Options
	logger *slog.Logger

	pending map[int64]*pendingWindow
	// last is the start of the latest window evaluated. Windows are evaluated in order, so
	// a rollup of a window at or before it cannot be evaluated any more.
	last time.Time
	// held is the window evaluated and not yet delivered: no later window is evaluated
	// until its alerts are published and its checkpoint saved, and its rollups are
	// acknowledged only then.
	held    *delivery
	failing string // the step whose failure was logged last, "" when delivering
	// seen is the highest stream sequence read; reading is false while the consumer is
	// gone and not yet made again.
	seen uint64
	// readBefore is whether the message being added is at or below seen when it came: read
	// before by this intake (a consumer made again replays from the oldest rollup held).
	readBefore bool
	reading    atomic.Bool
	// aggregators are the aggregators whose watermark was read, by consumer name.
	aggregators map[string]*aggregator
	wm          watermarkMetrics

	received  *prometheus.CounterVec
	skipped   *prometheus.CounterVec
	windows   prometheus.Counter
	evalTime  prometheus.Histogram
	ackErrors prometheus.Counter
	lastEval  prometheus.Gauge
	cpErrors  prometheus.Counter
	heldGauge prometheus.Gauge
	gone      prometheus.Counter
	cut       prometheus.Counter
	cutLogged bool // a window cut short was logged, and none has settled since
}

type pendingWindow struct {
	w       engine.Window
	msgs    messages
	first   time.Time // when its first rollup arrived
	arrived time.Time // when its latest rollup arrived
}

// maxGather bounds, past Settle and WatermarkTimeout, how long after its first rollup a
// window waits to settle: rollups that keep coming for it (put on the stream by hand, one
// every few seconds) would hold it, and every later window, for good.
const maxGather = 2 * time.Minute

// delivery is an evaluated window on its way out: publish, checkpoint, ack.
type delivery struct {
	start     time.Time
	msgs      messages
	alerts    []events.Alert
	published bool
	retryAt   time.Time
	backoff   time.Duration
}

// messages are a window's rollup messages, one per stream sequence: a copy delivered
// again replaces the handle (the newest is the one to acknowledge) instead of counting twice.
// A rollup stored twice on the stream, at two sequences under one Nats-Msg-Id (an aggregator
// publishes again, at start, rollups of a flush JetStream may hold already, and past the
// stream's duplicate window JetStream keeps both), counts once too; both are acknowledged
// with the window.
type messages struct {
	list []jetstream.Msg
	seqs map[uint64]int
	ids  map[string]struct{}
}

// What add did with a message.
type added int

const (
	addedNew         added = iota
	addedRedelivered       // the same stream sequence again
	addedDuplicate         // another sequence with a Nats-Msg-Id already taken
)

// add takes m at stream sequence seq (0 when unknown).
func (ms *messages) add(m jetstream.Msg, seq uint64) added {
	if seq > 0 {
		if i, ok := ms.seqs[seq]; ok {
			ms.list[i] = m
			return addedRedelivered
		}
		if ms.seqs == nil {
			ms.seqs = make(map[uint64]int)
		}
		ms.seqs[seq] = len(ms.list)
	}
	ms.list = append(ms.list, m)
	if id := m.Headers().Get(jetstream.MsgIDHeader); id != "" {
		if _, ok := ms.ids[id]; ok {
			return addedDuplicate
		}
		if ms.ids == nil {
			ms.ids = make(map[string]struct{})
		}
		ms.ids[id] = struct{}{}
	}
	return addedNew
}

// New returns an intake reading cons. Its metrics are registered on reg.
func New(cons jetstream.Consumer, eval Evaluator, sink Sink, cp Checkpoint, dead DeadLetter, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Intake {
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	if opts.AttemptTimeout <= 0 {
		opts.AttemptTimeout = 10 * time.Second
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 10 * time.Second
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "alerter", Name: name, Help: help})
	}
	in := &Intake{
		cons: cons, eval: eval, sink: sink, cp: cp, dead: dead, opts: opts,
		logger:      logger.With("component", "intake"),
		pending:     make(map[int64]*pendingWindow),
		last:        opts.Evaluated,
		aggregators: map[string]*aggregator{},
		wm:          newWatermarkMetrics(),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "rollups_received_total", Help: "Messages read from the ROLLUPS stream, by kind (tokens, gpu, engine, feedback, host, watermark).",
		}, []string{"kind"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "rollups_skipped_total",
			Help: "Rollups not evaluated, by reason: malformed or invalid (dead-lettered), unknown_subject, late (first delivered after their window was evaluated), redelivered (a copy of a rollup already handled), duplicate (a rollup stored twice under one Nats-Msg-Id, counted once), correction, not_evaluated (host rollups: no rule reads them).",
		}, []string{"reason"}),
		windows:   counter("windows_evaluated_total", "Windows evaluated."),
		ackErrors: counter("ack_errors_total", "Rollups whose ack failed (they will be redelivered)."),
		evalTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "alerter", Name: "evaluation_seconds", Help: "Time to evaluate one window.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		lastEval: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "alerter", Name: "last_evaluated_window_timestamp_seconds", Help: "Start of the latest window evaluated.",
		}),
		cpErrors: counter("checkpoint_errors_total", "Checkpoint saves that failed (the window's rollups stay unacknowledged; retried)."),
		gone:     counter("consumer_gone_total", "Times the ROLLUPS consumer stopped delivering (deleted, or its stream deleted) and was made again."),
		cut:      counter("windows_gathering_cut_total", "Windows evaluated while rollups still arrived for them, 2 minutes past their settle and watermark wait after their first rollup."),
	}
	in.heldGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "alerter", Name: "windows_undelivered",
		Help: "Windows evaluated whose alerts are not yet delivered (0 or 1): while 1, later windows wait and rollups stay unacknowledged.",
	})
	in.received.WithLabelValues("tokens")
	in.received.WithLabelValues("gpu")
	in.received.WithLabelValues("watermark")
	in.received.WithLabelValues("engine")
	in.received.WithLabelValues("feedback")
	in.received.WithLabelValues("host")
	for _, r := range reasons {
		in.skipped.WithLabelValues(r)
	}
	reg.MustRegister(in.received, in.skipped, in.windows, in.evalTime, in.ackErrors, in.lastEval, in.cpErrors, in.heldGauge, in.gone, in.cut)
	reg.MustRegister(in.wm.collectors()...)
	return in
}

// Run consumes until ctx ends, then shuts down in order: it stops intake (drains the
// subscription; what was not taken stays unacknowledged), finishes delivering the window
// in flight and delivers the windows whose settle time has passed, within
// ShutdownTimeout, and returns. The rest is left unacknowledged for the next start.
func (in *Intake) Run(ctx context.Context) error {
	msgs := make(chan jetstream.Msg, 4096)
	done := make(chan struct{})
	handler := func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-done: // shutting down: left unacknowledged, redelivered after restart
		}
	}
	// A consumer deleted while the connection was down sends no "consumer deleted": the
	// subscription only reports pulls that go unanswered, and is stopped here once the
	// consumer is found gone.
	errs := make(chan struct{}, 1)
	opts := []jetstream.PullConsumeOpt{jetstream.PullMaxMessages(1024), jetstream.ConsumeErrHandler(func(jetstream.ConsumeContext, error) {
		select {
		case errs <- struct{}{}:
		default:
		}
	})}
	cc, err := in.cons.Consume(handler, opts...)
	if err != nil {
		return fmt.Errorf("cannot consume rollups: %w", err)
	}
	in.reading.Store(true)
	closed := cc.Closed()
	var re reopening
	var checked time.Time
	// Deliveries run under work, which outlives ctx by ShutdownTimeout: a window whose
	// delivery is under way when shutdown begins is still published, stored and
	// acknowledged instead of failing on a cancelled context.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	stopDeadline := context.AfterFunc(ctx, func() { time.AfterFunc(in.opts.ShutdownTimeout, stopWork) })
	defer stopDeadline()

	tick := time.NewTicker(in.opts.Tick)
	defer tick.Stop()
loop:
	for {
		select {
		case m := <-msgs:
			in.Add(m, time.Now())
		case now := <-tick.C:
			in.Flush(work, now)
			if cc == nil && !now.Before(re.at) {
				cc = in.reopen(ctx, &re, now, handler, opts)
				if cc != nil {
					closed = cc.Closed()
				}
			}
		case <-errs:
			if cc != nil && time.Since(checked) >= 5*time.Second {
				checked = time.Now()
				if in.consumerGone(ctx) {
					cc.Stop() // closed follows
				}
			}
		case <-closed:
			if ctx.Err() != nil {
				break loop
			}
			// The consumer is gone (deleted, or with its stream): the subscription ended.
			if in.opts.Reopen == nil {
				return errors.New("cannot consume rollups: the consumer stopped delivering")
			}
			in.reading.Store(false)
			in.gone.Inc()
			in.logger.Warn("the rollups consumer stopped delivering (deleted, or its stream deleted); making it again")
			cc, closed = nil, nil
			re = reopening{at: time.Now()}
		case <-ctx.Done():
			break loop
		}
	}
	if cc != nil {
		cc.Drain()
	}
	close(done)
	if cc != nil {
		select {
		case <-cc.Closed():
		case <-work.Done():
		case <-time.After(5 * time.Second):
		}
	}
	in.flush(work, time.Now(), true)
	if n := len(in.pending) + in.undelivered(); n > 0 {
		in.logger.Info("stopped with windows not delivered; their rollups are unacknowledged and are read again at the next start",
			"windows", n)
	}
	return nil
}

// reopening is the state of making a gone consumer again: when to try next, and the
// backoff.
type reopening struct {
	at      time.Time
	backoff time.Duration
	failed  bool
}

// reopen makes the gone consumer again and consumes it; on failure it schedules the next
// attempt and returns nil. The consumer reads from the oldest rollup of the windows still
// held, so their rollups come again with their sequences (each counts once) and are
// acknowledged on it; rollups of windows evaluated already that come again are skipped as
// redelivered. On a stream made again, whose sequences start afresh, it reads from the
// first message, and the windows held keep what they gathered.
func (in *Intake) reopen(ctx context.Context, re *reopening, now time.Time, handler jetstream.MessageHandler, opts []jetstream.PullConsumeOpt) jetstream.ConsumeContext {
	from := in.resumeFrom()
	actx, cancel := context.WithTimeout(ctx, in.opts.AttemptTimeout)
	defer cancel()
	cons, another, err := in.opts.Reopen(actx, from, in.seen)
	var cc jetstream.ConsumeContext
	if err == nil {
		cc, err = cons.Consume(handler, opts...)
	}
	if err != nil {
		re.backoff = min(max(2*re.backoff, 250*time.Millisecond), 10*time.Second)
		re.at = now.Add(re.backoff)
		if !re.failed {
			in.logger.Warn("cannot make the rollups consumer again; retrying", "err", err)
			re.failed = true
		}
		return nil
	}
	if another {
		for _, p := range in.pending {
			p.msgs.seqs = nil
		}
		if in.held != nil {
			in.held.msgs.seqs = nil
		}
		in.seen, in.opts.Replayed = 0, 0
	} else {
		in.opts.Replayed = max(in.opts.Replayed, in.seen)
	}
	in.cons = cons
	in.reading.Store(true)
	in.logger.Info("reading rollups again", "from_seq", from, "stream_made_again", another)
	return cc
}

// consumerGone reports whether the consumer is known to be gone, with its stream or alone.
func (in *Intake) consumerGone(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, in.opts.AttemptTimeout)
	defer cancel()
	_, err := in.cons.Info(ctx)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// resumeFrom is the stream sequence a consumer made again reads from: the oldest rollup of
// the windows held, else the one after the last read (0 when none was read).
func (in *Intake) resumeFrom() uint64 {
	var from uint64
	oldest := func(ms *messages) {
		for seq := range ms.seqs {
			if from == 0 || seq < from {
				from = seq
			}
		}
	}
	for _, p := range in.pending {
		oldest(&p.msgs)
	}
	if in.held != nil {
		oldest(&in.held.msgs)
	}
	if from == 0 && in.seen > 0 {
		from = in.seen + 1
	}
	return from
}

// Reading reports whether the intake has a consumer delivering rollups (false before Run,
// and while a gone consumer is not made again yet); safe from any goroutine.
func (in *Intake) Reading() bool { return in.reading.Load() }

// Add takes one rollup message that arrived at now.
func (in *Intake) Add(m jetstream.Msg, now time.Time) {
	in.readBefore = false
	if meta, err := m.Metadata(); err == nil && meta != nil {
		seq := meta.Sequence.Stream
		in.readBefore = seq > 0 && seq <= in.seen
		in.seen = max(in.seen, seq)
	}
	subj := m.Subject()
	var start time.Time
	var seconds int
	var addTo func(*engine.Window)
	switch {
	case strings.HasPrefix(subj, "rollup.tokens."):
		in.received.WithLabelValues("tokens").Inc()
		var r events.TokenRollup
		if err := decode(m.Data(), &r); err != nil {
			in.reject(m, reasonMalformed, err)
			return
		}
		if err := checkToken(&r); err != nil {
			in.reject(m, reasonInvalid, err)
			return
		}
		if r.Kind == events.KindCorrection {
			in.skip(m, reasonCorrection)
			return
		}
		start, seconds = r.WindowStart, r.WindowSeconds
		addTo = func(w *engine.Window) { w.Tokens = append(w.Tokens, r) }
	case strings.HasPrefix(subj, "rollup.feedback."):
		in.received.WithLabelValues("feedback").Inc()
		var r events.FeedbackRollup
		if err := decode(m.Data(), &r); err != nil {
			in.reject(m, reasonMalformed, err)
			return
		}
		if err := checkFeedback(&r); err != nil {
			in.reject(m, reasonInvalid, err)
			return
		}
		if r.Kind == events.KindCorrection {
			in.skip(m, reasonCorrection)
			return
		}
		start, seconds = r.WindowStart, r.WindowSeconds
		addTo = func(w *engine.Window) { w.Feedback = append(w.Feedback, r) }
	case isWatermark(subj):
		in.addWatermark(m, now)
		return
	case strings.HasPrefix(subj, "rollup.host."):
		in.received.WithLabelValues("host").Inc()
		in.skip(m, reasonUnread)
		return
	case strings.HasPrefix(subj, "rollup.gpu."):
		in.received.WithLabelValues("gpu").Inc()
		var r events.GPURollup
		if err := decode(m.Data(), &r); err != nil {
			in.reject(m, reasonMalformed, err)
			return
		}
		if err := checkGPU(&r); err != nil {
			in.reject(m, reasonInvalid, err)
			return
		}
		if r.Kind == events.KindCorrection {
			in.skip(m, reasonCorrection)
			return
		}
		start, seconds = r.WindowStart, r.WindowSeconds
		addTo = func(w *engine.Window) { w.GPUs = append(w.GPUs, r) }
	case strings.HasPrefix(subj, "rollup.engine."):
		in.received.WithLabelValues("engine").Inc()
		var r events.EngineRollup
		if err := decode(m.Data(), &r); err != nil {
			in.reject(m, reasonMalformed, err)
			return
		}
		if err := checkEngine(&r); err != nil {
			in.reject(m, reasonInvalid, err)
			return
		}
		if r.Kind == events.KindCorrection {
			in.skip(m, reasonCorrection)
			return
		}
		start, seconds = r.WindowStart, r.WindowSeconds
		addTo = func(w *engine.Window) { w.Engines = append(w.Engines, r) }
	default:
		in.skip(m, reasonSubject)
		return
	}
	if ahead := start.Sub(now); ahead > maxAhead {
		// Evaluated, it would make every window before it late, and so would its checkpoint
		// after a restart.
		in.reject(m, reasonInvalid, fmt.Errorf("%w: window_start %s is %s ahead of the clock (at most %s)",
			errInvalidRollup, start.UTC().Format(time.RFC3339), ahead.Round(time.Second), maxAhead))
		return
	}
	seq, again := in.position(m)
	switch {
	case start.After(in.last):
		key := start.Unix()
		p := in.pending[key]
		if p == nil {
			p = &pendingWindow{w: engine.Window{Start: start.UTC(), Seconds: seconds}, first: now}
			in.pending[key] = p
		}
		switch p.msgs.add(m, seq) { // acknowledged with its window
		case addedRedelivered:
			in.skipped.WithLabelValues(reasonRedelivered).Inc()
			return
		case addedDuplicate:
			in.skipped.WithLabelValues(reasonDuplicate).Inc()
			return
		}
		p.w.Seconds = max(p.w.Seconds, seconds)
		addTo(&p.w)
		p.arrived = now
	case in.held != nil && start.Equal(in.held.start):
		// The window is evaluated and being delivered: the message is acknowledged with
		// it, so a crash before that reads it again.
		switch in.held.msgs.add(m, seq) {
		case addedNew:
			in.skipped.WithLabelValues(reasonLate).Inc()
		case addedRedelivered:
			in.skipped.WithLabelValues(reasonRedelivered).Inc()
		case addedDuplicate:
			in.skipped.WithLabelValues(reasonDuplicate).Inc()
		}
	case again:
		in.skip(m, reasonRedelivered)
	default:
		in.skip(m, reasonLate)
	}
}

// position returns m's stream sequence (0 when unknown) and whether it was delivered
// before: by this consumer, or by the one it replaced at start.
func (in *Intake) position(m jetstream.Msg) (uint64, bool) {
	meta, err := m.Metadata()
	if err != nil || meta == nil {
		return 0, false
	}
	seq := meta.Sequence.Stream
	return seq, meta.NumDelivered > 1 || (seq > 0 && seq <= in.opts.Replayed)
}

// Flush evaluates, oldest first, the windows whose last rollup arrived at least Settle
// before now, and delivers each: publishes its alerts, saves the checkpoint, and only then acknowledges its rollups. It stops at the first window still
// settling, so windows are always evaluated in order, and at a window whose delivery
// failed: that one is retried, with backoff, by a later Flush, and no later window is
// evaluated meanwhile. It returns how many windows it delivered.
func (in *Intake) Flush(ctx context.Context, now time.Time) int {
	return in.flush(ctx, now, false)
}

// flush is Flush; final is the last one, at shutdown: it ignores the backoff.
func (in *Intake) flush(ctx context.Context, now time.Time, final bool) int {
	n := 0
	for ctx.Err() == nil {
		if in.held == nil {
			p := in.oldestSettled(now)
			if p == nil {
				break
			}
			in.evaluate(p)
		}
		if !in.deliver(ctx, now, final) {
			break
		}
		n++
	}
	return n
}

func (in *Intake) oldestSettled(now time.Time) *pendingWindow {
	var oldest *pendingWindow
	for _, p := range in.pending {
		if oldest == nil || p.w.Start.Before(oldest.w.Start) {
			oldest = p
		}
	}
	if oldest == nil {
		return nil
	}
	if now.Sub(oldest.arrived) >= in.opts.Settle && !in.waitForWatermarks(oldest, now) {
		in.cutLogged = false
		return oldest
	}
	if now.Sub(oldest.first) < in.opts.Settle+in.opts.WatermarkTimeout+maxGather {
		return nil
	}
	in.cut.Inc()
	if !in.cutLogged {
		in.logger.Warn("a window kept receiving rollups past its settle and watermark wait; evaluated with what it has, later rollups of it are late",
			"window_start", oldest.w.Start, "rollups", len(oldest.msgs.list), "gathering", now.Sub(oldest.first).Round(time.Second))
		in.cutLogged = true
	}
	return oldest
}

func (in *Intake) evaluate(p *pendingWindow) {
	began := time.Now()
	alerts := in.eval.Evaluate(p.w)
	in.evalTime.Observe(time.Since(began).Seconds())
	delete(in.pending, p.w.Start.Unix())
	in.last = p.w.Start
	in.windows.Inc()
	in.lastEval.Set(float64(p.w.Start.Unix()))
	in.held = &delivery{start: p.w.Start, msgs: p.msgs, alerts: alerts}
	in.heldGauge.Set(1)
}

// deliver takes the held window as far as it can; it reports whether it is done.
func (in *Intake) deliver(ctx context.Context, now time.Time, final bool) bool {
	d := in.held
	if !final && now.Before(d.retryAt) {
		return false
	}
	if !d.published {
		// No timeout of the intake's: the sink bounds each alert's publish, so a window
		// with many alerts is not cut short.
		if err := in.sink.Publish(ctx, d.alerts); err != nil {
			in.retry(d, now, stepPublish, err)
			return false
		}
		d.published = true
	}
	if in.cp != nil {
		if err := in.attempt(ctx, func(ctx context.Context) error { return in.cp.Save(ctx, d.start) }); err != nil {
			in.cpErrors.Inc()
			in.retry(d, now, stepCheckpoint, err)
			return false
		}
	}
	for _, m := range d.msgs.list {
		if err := m.Ack(); err != nil {
			in.ackErrors.Inc()
		}
	}
	in.held = nil
	in.heldGauge.Set(0)
	if in.failing != "" {
		in.logger.Info("delivering windows again", "failed_step", in.failing)
		in.failing = ""
	}
	return true
}

func (in *Intake) attempt(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, in.opts.AttemptTimeout)
	defer cancel()
	return f(ctx)
}

// retry schedules the held window's next attempt with exponential backoff, and logs a
// failure only when the failing step changes.
func (in *Intake) retry(d *delivery, now time.Time, step string, err error) {
	d.backoff = min(max(2*d.backoff, 250*time.Millisecond), 10*time.Second)
	d.retryAt = now.Add(d.backoff)
	if in.failing != step {
		in.logger.Warn("cannot deliver window; its rollups stay unacknowledged and later windows wait",
			"step", step, "window_start", d.start, "err", err)
		in.failing = step
	}
}

func (in *Intake) undelivered() int {
	if in.held != nil {
		return 1
	}
	return 0
}

// Pending returns how many windows are gathering.
func (in *Intake) Pending() int { return len(in.pending) }

func (in *Intake) skip(m jetstream.Msg, reason string) {
	in.skipped.WithLabelValues(reason).Inc()
	if err := m.Ack(); err != nil {
		in.ackErrors.Inc()
	}
}

// reject terminates a rollup no redelivery can fix and dead-letters it with its reason.
// One this intake read before (a consumer made again replays from the oldest rollup held)
// was dead-lettered then: it is terminated and counted redelivered, not dead-lettered twice.
func (in *Intake) reject(m jetstream.Msg, reason string, err error) {
	if in.readBefore {
		in.skipped.WithLabelValues(reasonRedelivered).Inc()
		if err := m.Term(); err != nil {
			in.ackErrors.Inc()
		}
		return
	}
	in.skipped.WithLabelValues(reason).Inc()
	if in.dead != nil {
		_ = deadletter.Publish(in.dead, m.Subject(), m.Data(), reason, err)
	}
	if err := m.Term(); err != nil {
		in.ackErrors.Inc()
	}
}

var errInvalidRollup = errors.New("invalid rollup")

// maxAhead bounds how far ahead of the alerter's clock a rollup's window may start: an
// aggregator takes events at most events.MaxClockSkew ahead of its own clock, and its clock
// may be as far ahead of this one.
const maxAhead = 2 * events.MaxClockSkew

// maxWindowSeconds bounds a rollup's window_seconds as AGG_WINDOW is bounded: a day. One
// rollup beyond it would stretch its window for all the others (every host's rates per
// second near zero, the window's end past any time).
const maxWindowSeconds = 86400

// decode reads a rollup; a key given twice or in other letter case than its field's, which
// encoding/json would take silently, is malformed too.
func decode(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("cannot decode rollup: %w", err)
	}
	if err := events.CheckKeys(data, v); err != nil {
		return fmt.Errorf("cannot decode rollup: %w", err)
	}
	return nil
}

// checkLabels bounds the labels a rollup's alerts would carry as the event contract bounds
// them (events.MaxLabelLen): a longer one, which no aggregator writes, put on the stream by
// hand, made an alert with it in its labels and its summary over the server's payload
// limit, a publish no retry could make, which held its window and every later one.
func checkLabels(labels ...string) error {
	for i := 0; i+1 < len(labels); i += 2 {
		if v := labels[i+1]; len(v) > events.MaxLabelLen || !utf8.ValidString(v) {
			return fmt.Errorf("%w: %s of %d bytes is not a label (UTF-8, at most %d bytes)", errInvalidRollup, labels[i], len(v), events.MaxLabelLen)
		}
	}
	return nil
}

// checkWindow checks what every rollup has: its contract version (its schema's const: read
// as version 1, the figures of another could mean something else), and a window of at most a
// day that starts at a multiple of its length, as every aggregator's tumbling windows do.
// A rollup of a window starting elsewhere made a window of its own between two real ones, in
// which every other series was absent: each pending alert started again and each firing
// one counted a normal window.
func checkWindow(v int, start time.Time, seconds int) error {
	switch {
	case v != events.Version:
		return fmt.Errorf("%w: v=%d, want %d", errInvalidRollup, v, events.Version)
	case start.IsZero():
		return fmt.Errorf("%w: window_start is missing", errInvalidRollup)
	case seconds <= 0 || seconds > maxWindowSeconds:
		return fmt.Errorf("%w: window_seconds=%d must be 1 to %d", errInvalidRollup, seconds, maxWindowSeconds)
	case start.Nanosecond() != 0 || start.Unix()%int64(seconds) != 0:
		return fmt.Errorf("%w: window_start %s is not a multiple of window_seconds=%d", errInvalidRollup, start.UTC().Format(time.RFC3339Nano), seconds)
	}
	return nil
}

func checkKind(kind string) error {
	if kind != events.KindWindow && kind != events.KindCorrection {
		return fmt.Errorf("%w: kind %q is neither %s nor %s", errInvalidRollup, kind, events.KindWindow, events.KindCorrection)
	}
	return nil
}

func checkToken(r *events.TokenRollup) error {
	if err := checkWindow(r.V, r.WindowStart, r.WindowSeconds); err != nil {
		return err
	}
	switch {
	case r.Env == "" || r.Scene == "" || r.Model == "":
		return fmt.Errorf("%w: env, scene and model are required", errInvalidRollup)
	case r.Errors > r.Requests || r.Timeouts > r.Requests-r.Errors: // a sum could wrap around
		return fmt.Errorf("%w: errors %d + timeouts %d exceed requests %d", errInvalidRollup, r.Errors, r.Timeouts, r.Requests)
	case r.Completed > r.Requests || r.Abandoned > r.Requests-r.Completed:
		return fmt.Errorf("%w: completed %d + abandoned %d exceed requests %d", errInvalidRollup, r.Completed, r.Abandoned, r.Requests)
	}
	switch r.Layer {
	case "", events.LayerGateway, events.LayerEngine, events.LayerApp: // none: an older aggregator, the gateway
	default:
		return fmt.Errorf("%w: unknown layer %.64q", errInvalidRollup, r.Layer)
	}
	if err := checkLabels("env", r.Env, "scene", r.Scene, "model", r.Model, "instance", r.Instance, "bucket", r.Bucket); err != nil {
		return err
	}
	return checkKind(r.Kind)
}

func checkFeedback(r *events.FeedbackRollup) error {
	if err := checkWindow(r.V, r.WindowStart, r.WindowSeconds); err != nil {
		return err
	}
	switch {
	case r.Name == "":
		return fmt.Errorf("%w: name is required", errInvalidRollup)
	case r.Positive > r.Count:
		return fmt.Errorf("%w: positive %d exceeds count %d", errInvalidRollup, r.Positive, r.Count)
	}
	if err := checkLabels("env", r.Env, "scene", r.Scene, "model", r.Model, "name", r.Name, "source", r.Source); err != nil {
		return err
	}
	return checkKind(r.Kind)
}

func checkGPU(r *events.GPURollup) error {
	if err := checkWindow(r.V, r.WindowStart, r.WindowSeconds); err != nil {
		return err
	}
	switch {
	case r.Host == "":
		return fmt.Errorf("%w: host is required", errInvalidRollup)
	case r.UtilAvg < 0 || r.UtilAvg > 100 || r.EnergyJ < 0:
		return fmt.Errorf("%w: util_avg %v or energy_j %v out of range", errInvalidRollup, r.UtilAvg, r.EnergyJ)
	}
	if err := checkLabels("host", r.Host); err != nil {
		return err
	}
	return checkKind(r.Kind)
}

func checkEngine(r *events.EngineRollup) error {
	if err := checkWindow(r.V, r.WindowStart, r.WindowSeconds); err != nil {
		return err
	}
	switch {
	case r.Host == "" || r.Name == "":
		return fmt.Errorf("%w: host and name are required", errInvalidRollup)
	case r.UpSamples > r.Samples || r.DownSamples != r.Samples-r.UpSamples: // a sum could wrap around
		return fmt.Errorf("%w: up_samples %d + down_samples %d are not samples %d", errInvalidRollup, r.UpSamples, r.DownSamples, r.Samples)
	}
	for _, f := range []struct {
		name   string
		v, max float64
	}{
		{"queue_depth_avg", r.QueueDepthAvg, 1e9}, {"kv_cache_usage_avg", r.KVCacheUsageAvg, 1}, {"preemptions", r.Preemptions, 1e18},
		{"queue_time_seconds.p95", r.QueueTime.P95, 1e9}, {"prefill_time_seconds.p95", r.PrefillTime.P95, 1e9},
	} {
		if !(f.v >= 0 && f.v <= f.max) {
			return fmt.Errorf("%w: %s=%v out of range (0 to %g)", errInvalidRollup, f.name, f.v, f.max)
		}
	}
	for _, h := range []struct {
		name string
		h    *events.EngineHistogram
	}{{"queue_time_seconds", &r.QueueTime}, {"prefill_time_seconds", &r.PrefillTime}} {
		if len(h.h.Counts) != 0 && len(h.h.Counts) != len(h.h.Le)+1 {
			return fmt.Errorf("%w: %s has %d counts for %d bounds", errInvalidRollup, h.name, len(h.h.Counts), len(h.h.Le))
		}
	}
	if err := checkLabels("host", r.Host, "engine", r.Engine, "name", r.Name, "model", r.Model); err != nil {
		return err
	}
	return checkKind(r.Kind)
}
