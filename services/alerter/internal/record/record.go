package record

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/deadletter"
)

// rowStore is the alerts table; *Store is the ClickHouse one.
type rowStore interface {
	Stored(ctx context.Context, keys []Key) (map[Key]bool, error)
	Write(ctx context.Context, queryID string, alerts []events.Alert) error
	Settle(ctx context.Context, queryID string) error
}

// DeadLetter takes a message no consumer can use; a *nats.Conn is one.
type DeadLetter = deadletter.Publisher

// Options tune a Recorder; zero values take the defaults.
type Options struct {
	Batch          int           // messages per insert (default 256)
	AttemptTimeout time.Duration // one look-up and insert (default 10 s)
	DrainTimeout   time.Duration // how long Run keeps storing what is on the stream once its context ends (default 5 s)
	// Reopen makes the consumer again when it is gone (the stream deleted and made again);
	// nil keeps reading the one given.
	Reopen func(ctx context.Context) (jetstream.Consumer, error)
}

// The reasons an alert message makes no row.
const (
	reasonMalformed = "malformed" // not an alert's JSON: dead-lettered
	reasonInvalid   = "invalid"   // an alert without what its row needs: dead-lettered
	reasonStored    = "stored"    // its row is in the table already (delivered again)
)

// Recorder writes the alerts of the ALERTS stream into the alerts table, from one goroutine
// (Run).
type Recorder struct {
	cons   jetstream.Consumer
	store  rowStore
	dead   DeadLetter
	opts   Options
	logger *slog.Logger
	newID  func() string

	failing   bool
	reading   bool // the last fetch failed, and was logged
	lookAt    time.Time
	storedSeq uint64

	written  prometheus.Counter
	skipped  *prometheus.CounterVec
	errors   prometheus.Counter
	ackErrs  prometheus.Counter
	behind   prometheus.Gauge
	lastSeen prometheus.Gauge
}

// New returns a recorder reading cons, a durable consumer of ALERTS that acknowledges
// explicitly. Its metrics are registered on reg.
func New(cons jetstream.Consumer, store rowStore, dead DeadLetter, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Recorder {
	if opts.Batch <= 0 {
		opts.Batch = 256
	}
	if opts.AttemptTimeout <= 0 {
		opts.AttemptTimeout = 10 * time.Second
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 5 * time.Second
	}
	r := &Recorder{
		cons: cons, store: store, dead: dead, opts: opts, logger: logger.With("component", "record"),
		newID: events.NewEventID,
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alert_rows_written_total", Help: "Alert rows inserted into the alerts table from the ALERTS stream.",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alert_rows_skipped_total",
			Help: "ALERTS messages that made no row, by reason: stored (the table has the row already: delivered again), malformed or invalid (dead-lettered).",
		}, []string{"reason"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alert_store_errors_total",
			Help: "Attempts to store alert rows that failed (ClickHouse away or refusing); the messages stay unacknowledged and are retried.",
		}),
		ackErrs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "alerter", Name: "alert_rows_ack_errors_total", Help: "ALERTS messages stored whose ack failed (delivered again, then skipped as stored).",
		}),
		behind: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "alerter", Name: "alert_rows_behind",
			Help: "ALERTS messages not yet stored in the alerts table (pending and unacknowledged on the consumer, read every 10 s).",
		}),
		lastSeen: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "alerter", Name: "alert_rows_stored_seq", Help: "Stream sequence of the latest ALERTS message whose row is stored.",
		}),
	}
	for _, reason := range []string{reasonMalformed, reasonInvalid, reasonStored} {
		r.skipped.WithLabelValues(reason)
	}
	reg.MustRegister(r.written, r.skipped, r.errors, r.ackErrs, r.behind, r.lastSeen)
	return r
}

// Run stores rows until ctx ends, then for up to DrainTimeout stores what the stream
// already holds (the alerts of the last windows evaluated), and returns. Whatever is not
// stored stays unacknowledged on the consumer, for the next start.
func (r *Recorder) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		r.look(ctx, time.Now())
		batch, err := r.cons.Fetch(r.opts.Batch, jetstream.FetchMaxWait(time.Second))
		var msgs []jetstream.Msg
		if err == nil {
			msgs = collect(batch)
			err = batch.Error()
		}
		if len(msgs) > 0 {
			r.save(ctx, msgs)
		}
		if err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			r.fetchFailed(ctx, err)
			continue
		}
		if r.reading {
			r.logger.Info("reading ALERTS again")
			r.reading = false
		}
	}
	final, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opts.DrainTimeout)
	defer cancel()
	for final.Err() == nil {
		batch, err := r.cons.FetchNoWait(r.opts.Batch)
		if err != nil {
			break
		}
		msgs := collect(batch)
		if len(msgs) == 0 {
			break
		}
		if !r.save(final, msgs) {
			break
		}
	}
	return nil
}

// fetchFailed logs a failed read once, makes the consumer again when it is gone, and waits
// a second.
func (r *Recorder) fetchFailed(ctx context.Context, err error) {
	if !r.reading {
		r.logger.Warn("cannot read ALERTS for the alerts table; retrying", "err", err)
		r.reading = true
	}
	gone := errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrNoResponders)
	if gone && r.opts.Reopen != nil {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if cons, oerr := r.opts.Reopen(octx); oerr == nil {
			r.cons = cons
		}
		cancel()
	}
	sleep(ctx, time.Second)
}

func collect(batch jetstream.MessageBatch) []jetstream.Msg {
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	return msgs
}

// look reads, every 10 s, how many messages the consumer has not had acknowledged.
func (r *Recorder) look(ctx context.Context, now time.Time) {
	if now.Sub(r.lookAt) < 10*time.Second {
		return
	}
	r.lookAt = now
	ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if info, err := r.cons.Info(ictx); err == nil {
		r.behind.Set(float64(info.NumPending + uint64(info.NumAckPending)))
	}
}

// item is one alert message to store.
type item struct {
	m     jetstream.Msg
	alert events.Alert
	key   Key
	seq   uint64
}

// save stores the rows of msgs, retrying with backoff until it succeeds or ctx ends, and
// acknowledges the messages once their rows are in the table. It reports whether it stored
// them.
func (r *Recorder) save(ctx context.Context, msgs []jetstream.Msg) bool {
	items := make([]item, 0, len(msgs))
	inBatch := make(map[Key]bool, len(msgs))
	var dup []jetstream.Msg
	for _, m := range msgs {
		it, reason, err := decode(m)
		if err != nil {
			r.reject(m, reason, err)
			continue
		}
		if inBatch[it.key] { // the same state change twice on the stream: one row
			dup = append(dup, m)
			continue
		}
		inBatch[it.key] = true
		items = append(items, it)
	}
	queryID := ""
	backoff := time.Duration(0)
	for {
		stored, err := r.attempt(ctx, items, &queryID)
		if err == nil {
			r.skipped.WithLabelValues(reasonStored).Add(float64(stored + len(dup)))
			for _, it := range items {
				r.ack(it.m)
				r.storedSeq = max(r.storedSeq, it.seq)
			}
			r.lastSeen.Set(float64(r.storedSeq))
			for _, m := range dup {
				r.ack(m)
			}
			if r.failing {
				r.logger.Info("storing alert rows again")
				r.failing = false
			}
			return true
		}
		r.errors.Inc()
		if !r.failing {
			r.logger.Warn("cannot store alert rows; they stay on the ALERTS stream and are retried", "err", err)
			r.failing = true
		}
		backoff = min(max(2*backoff, 250*time.Millisecond), 10*time.Second)
		if !sleep(ctx, backoff) {
			return false
		}
		for _, it := range items { // still being worked on: no redelivery meanwhile
			_ = it.m.InProgress()
		}
	}
}

// attempt stores the rows of items not in the table yet and returns how many were there
// already. An earlier attempt of the batch (queryID) is waited for first: it may have
// landed after its client gave up.
func (r *Recorder) attempt(ctx context.Context, items []item, queryID *string) (int, error) {
	if len(items) == 0 {
		return 0, nil
	}
	actx, cancel := context.WithTimeout(ctx, r.opts.AttemptTimeout)
	defer cancel()
	if *queryID != "" {
		if err := r.store.Settle(actx, *queryID); err != nil {
			return 0, err
		}
	}
	keys := make([]Key, len(items))
	for i := range items {
		keys[i] = items[i].key
	}
	have, err := r.store.Stored(actx, keys)
	if err != nil {
		return 0, err
	}
	rows := make([]events.Alert, 0, len(items))
	for i := range items {
		if !have[items[i].key] {
			rows = append(rows, items[i].alert)
		}
	}
	if len(rows) == 0 {
		return len(items), nil
	}
	*queryID = "alerts-" + r.newID()
	if err := r.store.Write(actx, *queryID, rows); err != nil {
		return 0, err
	}
	r.written.Add(float64(len(rows)))
	return len(items) - len(rows), nil
}

func (r *Recorder) ack(m jetstream.Msg) {
	if err := m.Ack(); err != nil {
		r.ackErrs.Inc()
	}
}

var errInvalidAlert = errors.New("invalid alert")

// decode reads an alert message, or says why it cannot make a row.
func decode(m jetstream.Msg) (item, string, error) {
	it := item{m: m}
	if meta, err := m.Metadata(); err == nil && meta != nil {
		it.seq = meta.Sequence.Stream
	}
	if err := json.Unmarshal(m.Data(), &it.alert); err != nil {
		return it, reasonMalformed, fmt.Errorf("cannot decode alert: %w", err)
	}
	a := &it.alert
	switch {
	case a.Fingerprint == "" || len(a.Fingerprint) > 64:
		return it, reasonInvalid, fmt.Errorf("%w: fingerprint %q must be 1 to 64 bytes", errInvalidAlert, truncate(a.Fingerprint))
	case a.State != events.AlertFiring && a.State != events.AlertResolved:
		return it, reasonInvalid, fmt.Errorf("%w: state %q is neither %s nor %s", errInvalidAlert, truncate(a.State), events.AlertFiring, events.AlertResolved)
	case a.Rule == "" || a.Severity == "":
		return it, reasonInvalid, fmt.Errorf("%w: rule and severity are required", errInvalidAlert)
	case !inDateTime(a.At):
		return it, reasonInvalid, fmt.Errorf("%w: at %s is missing or outside 1970 to 2105", errInvalidAlert, a.At.Format(time.RFC3339))
	}
	it.key = KeyOf(a)
	return it, "", nil
}

// inDateTime reports whether t fits ClickHouse's DateTime, which the at column is on
// older servers.
func inDateTime(t time.Time) bool {
	return t.Unix() > 0 && t.Year() < 2106
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// reject terminates a message no redelivery can fix and dead-letters it with its reason.
func (r *Recorder) reject(m jetstream.Msg, reason string, err error) {
	r.skipped.WithLabelValues(reason).Inc()
	if r.dead != nil {
		_ = deadletter.Publish(r.dead, m.Subject(), m.Data(), reason, err)
	}
	if err := m.Term(); err != nil {
		r.ackErrs.Inc()
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
