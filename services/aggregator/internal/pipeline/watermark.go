package pipeline

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Watermarks publishes how far an aggregator has got, on rollup.watermark.<consumer> in the
// ROLLUPS stream, so that an alerter reading several partitioned aggregators evaluates a
// window only once each of them has published it, not on a wall-clock guess.
//
// Each pipeline reports, after every flush, the end of the latest window it has closed and
// whose rollups JetStream has acknowledged (a flush still being written or waiting for its
// acks reports nothing). The aggregator's watermark is the lowest over its pipelines that have seen a
// message since start: a pipeline that has seen none holds no window and owes no rollup.
// A pipeline whose stream held messages past its floor at start holds the watermark until
// it has processed through the last of them and reported the windows that flush closed,
// whatever became of those messages (added, late, dead-lettered): without that, another
// pipeline's progress would carry the watermark past windows its backlog still holds before
// it has read them. It is published once the rollup publisher holds nothing unacknowledged,
// so JetStream has stored every rollup it covers ahead of it, and it never goes back.
type Watermarks struct {
	js       watermarkPublisher
	rollups  interface{ Buffered() int }
	consumer string
	window   time.Duration
	every    time.Duration
	logger   *slog.Logger

	resumed time.Time // the last watermark an earlier process published (Resume)

	mu      sync.Mutex
	through map[string]time.Time // per pipeline (stream): windows closed through
	holding map[string]int       // per pipeline: holds (outbox replay, backlog at start) not yet released
	sent    time.Time
	failing bool

	published  prometheus.Counter
	errors     prometheus.Counter
	throughSec prometheus.Gauge
}

type watermarkPublisher interface {
	PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// NewWatermarks returns the watermark publisher of the aggregator reading as consumer, with
// windows of window; rollups is the publisher its rollups go through. Its metrics are
// registered on reg.
func NewWatermarks(js watermarkPublisher, rollups interface{ Buffered() int }, consumer string, window time.Duration, reg prometheus.Registerer, logger *slog.Logger) *Watermarks {
	w := &Watermarks{
		js: js, rollups: rollups, consumer: consumer, window: window, every: 200 * time.Millisecond,
		logger: logger.With("component", "watermark"), through: map[string]time.Time{}, holding: map[string]int{},
		published: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "aggregator", Name: "watermarks_published_total",
			Help: "Watermarks JetStream stored on rollup.watermark.<consumer>."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "aggregator", Name: "watermark_publish_errors_total",
			Help: "Watermark publishes JetStream did not acknowledge (retried)."}),
		throughSec: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "aggregator", Name: "watermark_published_timestamp_seconds",
			Help: "End of the latest window the published watermark covers."}),
	}
	reg.MustRegister(w.published, w.errors, w.throughSec)
	return w
}

// watermarked is a stage whose closed windows move the watermark.
type watermarked interface {
	inWatermark() bool
	resume(through time.Time) // windows ending at or before through are closed (window.Resume)
}

// lastMessages reads a stream's last message on a subject; a jetstream.Stream does.
type lastMessages interface {
	GetLastMsgForSubject(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
}

// Resume reads from rollups (the ROLLUPS stream) the last watermark this aggregator
// published, before the pipelines start (and before PublishWatermarks), and takes it as
// published: a later one goes out only past it, so whoever reads ROLLUPS never sees the
// watermark go back across a restart, and the pipelines treat the windows it covers as
// closed. The stream, not a record of its own, is what readers saw: nothing to write per
// watermark, and no kill between a publish and a record can leave the record behind. A
// message there that is no watermark of this aggregator, or one more than
// events.MaxClockSkew ahead of now, is logged and ignored. It returns the watermark's through,
// zero when there is none.
func (w *Watermarks) Resume(ctx context.Context, rollups lastMessages, now time.Time) (time.Time, error) {
	subject := events.WatermarkSubject(w.consumer)
	m, err := whenReady(ctx, func() (*jetstream.RawStreamMsg, error) { return rollups.GetLastMsgForSubject(ctx, subject) })
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("cannot read the last watermark on %s: %w", subject, err)
	}
	var wm events.Watermark
	if err := json.Unmarshal(m.Data, &wm); err != nil || wm.V != 1 || wm.Consumer != w.consumer || wm.Through.Unix() <= 0 {
		w.logger.Warn("the last message on the watermark subject is no watermark of this aggregator; starting from none", "subject", subject, "stream_seq", m.Sequence)
		return time.Time{}, nil
	}
	if ahead := wm.Through.Sub(now); ahead > events.MaxClockSkew {
		w.logger.Warn("the last watermark published is ahead of the clock; starting from none", "through", wm.Through, "ahead", ahead.Round(time.Second).String())
		return time.Time{}, nil
	}
	through := wm.Through.UTC()
	w.mu.Lock()
	w.resumed, w.sent = through, through
	w.mu.Unlock()
	w.throughSec.Set(float64(through.Unix()))
	return through, nil
}

// PublishWatermarks makes p report its closed windows to w; called before Run. When w
// resumed from the watermark an earlier process published (Resume), p's windows ending at or
// before it are closed: what comes for them is a correction, so no ordinary window rollup
// follows a watermark that covers it, across restarts too. While p publishes again what
// an earlier process stored (outbox), it holds the watermark; and while it reads the
// messages its stream held past its floor at start (see Watermarks), too.
func (p *Pipeline) PublishWatermarks(ctx context.Context, w *Watermarks) error {
	p.marks = w
	s, ok := p.stage.(watermarked)
	if !ok || !s.inWatermark() {
		return nil
	}
	if !w.resumed.IsZero() {
		s.resume(w.resumed)
	}
	if len(p.outbox.replay) > 0 {
		p.outbox.holds = true
		p.holdWatermark()
	}
	last, err := lastPosition(ctx, p.js, p.opts.Stream, p.opts.Filter)
	if err != nil {
		return err
	}
	if last > p.lastSeq {
		p.mu.Lock()
		p.backlog, p.backlogAt = last, time.Now()
		p.mu.Unlock()
		p.holdWatermark()
		p.logger.Info("holding the watermark until the messages the stream held at start are read", "from", p.lastSeq+1, "through", last)
	}
	return nil
}

// lastPosition returns the stream position of the last message of stream matching filter,
// zero when there is none.
func lastPosition(ctx context.Context, js jetstream.JetStream, stream, filter string) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("cannot look up stream %s: %w", stream, err)
	}
	m, err := whenReady(ctx, func() (*jetstream.RawStreamMsg, error) { return s.GetLastMsgForSubject(ctx, cmp.Or(filter, ">")) })
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cannot read the last message of %s on %s: %w", stream, filter, err)
	}
	return m.Sequence, nil
}

// holdWatermark and releaseWatermark pair each hold of the pipeline with its release, and
// show in the watermark_held gauge whether it holds any. A hold is taken before Run, which
// shows it: a term of the lease cut short before its pipelines run leaves the gauge as the
// last one that ran did, at 0.
func (p *Pipeline) holdWatermark() {
	p.holds++
	p.marks.hold(p.opts.Stream)
}

func (p *Pipeline) releaseWatermark() {
	p.holds--
	if p.holds == 0 {
		p.m.watermarkHeld.Set(0)
	}
	p.marks.release(p.opts.Stream)
}

// releaseBacklog ends the hold of the backlog at start once a cut that took its last
// message has been published and its closed windows reported (cycle).
func (p *Pipeline) releaseBacklog() {
	p.mu.Lock()
	at := p.backlogAt
	p.backlog, p.backlogAt, p.backlogGone = 0, time.Time{}, false
	p.mu.Unlock()
	p.releaseWatermark()
	p.logger.Info("read the messages the stream held at start; the watermark moves again", "after", time.Since(at).Round(time.Millisecond).String())
}

// closedThrough returns the end of the latest window the stage has closed as of now, or the
// zero time when the pipeline publishes no watermark or has seen nothing. Called under the
// lock, with the now of the cut.
func (p *Pipeline) closedThrough(now time.Time) time.Time {
	if p.marks == nil {
		return time.Time{}
	}
	if s, ok := p.stage.(interface{ closedThrough(time.Time) time.Time }); ok {
		return s.closedThrough(now)
	}
	return time.Time{}
}

// advanceWatermark reports that the windows through the given end are closed and their
// rollups acknowledged by JetStream.
func (p *Pipeline) advanceWatermark(through time.Time) {
	if p.marks != nil && !through.IsZero() {
		p.marks.advance(p.opts.Stream, through)
	}
}

func (s *tokenStage) inWatermark() bool { return true }

func (s *tokenStage) resume(through time.Time) { s.agg.Resume(through) }

func (s *tokenStage) closedThrough(now time.Time) time.Time {
	return windowsClosedThrough(s.agg.Watermark(now), s.cfg.Window, s.cfg.Lateness)
}

// windowsClosedThrough is the end of the latest window a watermark wm has closed: a window
// closes once wm reaches its end + lateness (window.Advance). Zero when wm is unset.
func windowsClosedThrough(wm time.Time, window, lateness time.Duration) time.Time {
	if wm.Unix() <= 0 || window <= 0 {
		return time.Time{}
	}
	e := wm.Add(-lateness).UnixNano()
	w := int64(window)
	end := e / w * w
	if e < 0 && e%w != 0 {
		end -= w
	}
	return time.Unix(0, end).UTC()
}

func (w *Watermarks) advance(stream string, through time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if through.After(w.through[stream]) {
		w.through[stream] = through
	}
}

// hold keeps the watermark where it is while the pipeline of stream publishes again the
// rollups an earlier process stored (outbox), or reads the backlog it had at start: another
// pipeline's progress must not carry a watermark past them before they are on ROLLUPS.
// Each hold is ended by one release.
func (w *Watermarks) hold(stream string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.holding[stream]++
}

func (w *Watermarks) release(stream string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holding[stream]--; w.holding[stream] <= 0 {
		delete(w.holding, stream)
	}
}

// current returns the watermark to publish: the lowest of the pipelines that reported, or
// zero while a pipeline holds it.
func (w *Watermarks) current() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.holding) > 0 {
		return time.Time{}
	}
	var low time.Time
	for _, t := range w.through {
		if low.IsZero() || t.Before(low) {
			low = t
		}
	}
	return low
}

// Run publishes the watermark whenever it moves, until ctx ends; then, for up to 5 s, it
// publishes the one of the last flush, once its rollups are out.
func (w *Watermarks) Run(ctx context.Context) error {
	tick := time.NewTicker(w.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for final.Err() == nil && w.current().After(w.sent) {
				if !w.publish(final, time.Now()) {
					select {
					case <-final.Done():
					case <-tick.C:
					}
				}
			}
			return nil
		case now := <-tick.C:
			w.publish(ctx, now)
		}
	}
}

// publish sends the current watermark if it moved and every rollup queued before it was
// read is stored. It reports whether one was sent.
func (w *Watermarks) publish(ctx context.Context, now time.Time) bool {
	through := w.current() // read before looking at the queue: those rollups were queued before
	if through.IsZero() || !through.After(w.sent) || w.rollups.Buffered() > 0 {
		return false
	}
	data, err := json.Marshal(events.Watermark{V: 1, Consumer: w.consumer, Through: through, WindowSeconds: int(w.window / time.Second), At: now.UTC()})
	if err != nil {
		return false // a struct of strings and times always encodes
	}
	m := &nats.Msg{Subject: events.WatermarkSubject(w.consumer), Data: data, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, "wm-"+w.consumer+"-"+strconv.FormatInt(through.Unix(), 10))
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.js.PublishMsg(pctx, m, jetstream.WithExpectStream(events.StreamRollups)); err != nil {
		w.errors.Inc()
		if !w.failing {
			w.logger.Warn("cannot publish the watermark; retrying", "err", fmt.Errorf("cannot publish on %s: %w", m.Subject, err))
			w.failing = true
		}
		return false
	}
	if w.failing {
		w.logger.Info("publishing the watermark again")
		w.failing = false
	}
	w.sent = through
	w.published.Inc()
	w.throughSec.Set(float64(through.Unix()))
	return true
}
