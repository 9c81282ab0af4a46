package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
)

// outbox is a pipeline's side of rollup_outbox. Each flush's rollup messages are stored
// there, in one insert, before the flush's rows; the flush is numbered (flush_seq) and, once
// JetStream has acknowledged all its rollups, its number is saved as the pipeline's acked
// mark in FloorBucket (<stream>.<consumer>.acked). At start, every flush numbered after the
// mark, cut after the floor and whose rows are stored is published again under the same
// message ids before consuming resumes: JetStream drops what it already holds within its
// duplicate window, and a kill between the store and the acks loses no rollup.
type outbox struct {
	sink  *sink.ClickHouse
	mark  *floorStore
	acked uint64 // the last flush JetStream acknowledged all the rollups of
	saved uint64 // the mark last saved
	next  uint64 // the number of the next flush
	// failing tells that the last save of the mark failed, so that a failure that repeats is
	// logged once.
	failing bool

	replay  []sink.OutboxMsg // read at start: the rollups to publish again
	flushes int              // how many flushes they are
	holds   bool             // the watermark waits for them (PublishWatermarks)
}

// openOutbox loads the acked mark of the pipeline whose floor is floor.
func openOutbox(ctx context.Context, floor *floorStore, sk *sink.ClickHouse) (outbox, error) {
	mark := &floorStore{kv: floor.kv, key: floor.key + ".acked"}
	acked, err := mark.load(ctx)
	if err != nil {
		return outbox{}, err
	}
	return outbox{sink: sk, mark: mark, acked: acked, saved: acked, next: acked + 1}, nil
}

// read reads, with the ledger (after the settling), the number of the next flush and what
// is to be published again: the flushes of stream after the floor and the mark whose rows
// table stores.
func (o *outbox) read(ctx context.Context, stream, table string, floor uint64) error {
	last, err := o.sink.LastFlushSeq(ctx, stream)
	if err != nil {
		return err
	}
	o.next = max(last, o.acked) + 1
	o.replay, o.flushes, err = o.sink.Unacknowledged(ctx, stream, table, floor, o.acked)
	return err
}

// cutFlush is a flush on its way: its number, and how far it got.
type cutFlush struct {
	flush
	seq      uint64 // flush_seq
	outboxed bool   // its messages are in rollup_outbox
	attempt  int    // outbox inserts tried
	stored   bool   // its rows are stored
}

// store writes fl's messages to rollup_outbox, unless an earlier attempt did, then its rows.
// A retry first settles the earlier outbox insert and counts what it stored (one insert is
// one part: all or nothing).
func (p *Pipeline) store(ctx context.Context, fl *cutFlush, now time.Time) error {
	if msgs := fl.messages(); len(msgs) > 0 && !fl.outboxed {
		sk, l := p.outbox.sink, fl.id()
		fl.attempt++
		if fl.attempt > 1 {
			if err := sk.Settle(ctx, l.FlushID+"-outbox-"); err != nil {
				return err
			}
			n, err := sk.RowsOfFlush(ctx, "rollup_outbox", l.FlushID)
			if err != nil {
				return err
			}
			fl.outboxed = n >= uint64(len(msgs))
		}
		if !fl.outboxed {
			qctx := sk.WithQueryID(ctx, l.FlushID+"-outbox-"+strconv.Itoa(fl.attempt))
			if err := sk.WriteOutbox(qctx, p.opts.Stream, l, fl.seq, msgs, now); err != nil {
				return err
			}
			fl.outboxed = true
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.opts.Held.Err() != nil { // between the outbox's insert and the rows'
		return context.Cause(p.opts.Held)
	}
	return fl.write(ctx, now)
}

// replay publishes what the last process stored and did not see acknowledged, and waits for
// the acks; false when ctx ended first (the next start publishes it again).
func (p *Pipeline) replay(ctx context.Context) bool {
	o := &p.outbox
	if len(o.replay) == 0 {
		return true
	}
	if !p.publish(ctx, o.replay) {
		return false
	}
	p.m.republished.Add(float64(len(o.replay)))
	p.logger.Info("published again the rollups of flushes stored but not acknowledged by JetStream before the last stop", "flushes", o.flushes, "rollups", len(o.replay))
	o.replay = nil
	o.acked = o.next - 1
	p.saveMark(ctx)
	if o.holds {
		o.holds = false
		p.releaseWatermark()
	}
	return true
}

// saveMark stores the acked mark when it moved. A failure is counted, and logged when the
// last save did not fail; the next cycle tries again, and a start meanwhile publishes again rollups JetStream already has
// (dropped as duplicates within its duplicate window).
func (p *Pipeline) saveMark(ctx context.Context) {
	o := &p.outbox
	if o.mark == nil || o.acked <= o.saved || p.stopped(ctx) {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := o.mark.save(sctx, o.acked); err != nil {
		p.m.ackErrors.Inc()
		if !o.failing {
			p.logger.Warn("cannot save the acked mark; the next flushes try again", "err", err)
			o.failing = true
		}
		return
	}
	if o.failing {
		p.logger.Info("saving the acked mark again", "acked", o.acked)
		o.failing = false
	}
	o.saved = o.acked
}

// OutboxSweeper keeps rollup_outbox small, on every server: a row is needed only until
// JetStream has acknowledged its flush's rollups (its flush_seq at or below the acked mark
// of its consumer and stream), and a daily partition whose every row is so, and whose newest
// row is older than OutboxKeep, is dropped whole (ALTER TABLE … DROP PARTITION, as cheap as
// deleting a folder). The table has no TTL, and without this it would grow for good. A
// partition holding a flush not yet acknowledged is kept, however old, until its aggregator
// has started again and published it: a flush is never dropped before its rollups are on ROLLUPS. The table is
// shared by every aggregator writing to this database, so the sweep judges every
// consumer's rows by that consumer's mark, read from FloorBucket.
type OutboxSweeper struct {
	kv     jetstream.KeyValue
	sink   *sink.ClickHouse
	every  time.Duration
	logger *slog.Logger

	failing bool
	dropped prometheus.Counter
	errors  prometheus.Counter
}

// OutboxKeep is how old a partition's newest row must be for the partition to be dropped:
// rows are written with their writer's clock, so a partition this old takes no more (a
// write held by a server that hung for a day aside).
const OutboxKeep = 24 * time.Hour

// NewOutboxSweeper returns the sweeper of rollup_outbox on ch, reading the marks in
// FloorBucket (replicas as the streams'); its metrics are registered on reg.
func NewOutboxSweeper(ctx context.Context, js jetstream.JetStream, ch driver.Conn, replicas int, reg prometheus.Registerer, logger *slog.Logger) (*OutboxSweeper, error) {
	kv, err := bus.EnsureKeyValue(ctx, js, FloorBucket, "tokenscope aggregator: stream position stored through, per stream and consumer", replicas)
	if err != nil {
		return nil, err
	}
	s := &OutboxSweeper{kv: kv, sink: sink.New(ch, ""), every: time.Hour, logger: logger.With("component", "outbox"),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "aggregator", Name: "outbox_partitions_dropped_total",
			Help: "Daily partitions of rollup_outbox dropped: every flush in them acknowledged by JetStream, the newest row older than a day."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "aggregator", Name: "outbox_sweep_errors_total",
			Help: "Sweeps of rollup_outbox that failed (retried at the next)."}),
	}
	reg.MustRegister(s.dropped, s.errors)
	return s, nil
}

// Run sweeps at start and then every hour until ctx ends.
func (s *OutboxSweeper) Run(ctx context.Context) error {
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		_, err := s.Sweep(ctx, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			s.errors.Inc()
			if !s.failing {
				s.logger.Warn("cannot sweep rollup_outbox; trying again in an hour", "err", err)
				s.failing = true
			}
		case err == nil && s.failing:
			s.logger.Info("sweeping rollup_outbox again")
			s.failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sweep drops the partitions of rollup_outbox that are no longer needed as of now, and
// returns how many it dropped.
func (s *OutboxSweeper) Sweep(ctx context.Context, now time.Time) (int, error) {
	parts, err := s.sink.OutboxPartitions(ctx)
	if err != nil {
		return 0, err
	}
	marks := map[string]uint64{}
	keep := map[uint32]bool{}
	var days []uint32
	for _, p := range parts {
		if _, seen := keep[p.Day]; !seen {
			days = append(days, p.Day)
			keep[p.Day] = false
		}
		if keep[p.Day] {
			continue
		}
		if now.Sub(p.Newest) < OutboxKeep {
			keep[p.Day] = true
			continue
		}
		key := p.Stream + "." + p.Consumer + ".acked"
		mark, ok := marks[key]
		if !ok {
			mark, err = (&floorStore{kv: s.kv, key: key}).load(ctx)
			if errors.Is(err, jetstream.ErrInvalidKey) {
				mark, err = 0, nil // no mark can be kept under such a name: keep its rows
			}
			if err != nil {
				return 0, err
			}
			marks[key] = mark
		}
		if p.LastFlushSeq > mark {
			keep[p.Day] = true
		}
	}
	dropped := 0
	for _, day := range days {
		if keep[day] {
			continue
		}
		if err := s.sink.DropOutboxPartition(ctx, day); err != nil {
			return dropped, err
		}
		dropped++
		s.dropped.Inc()
	}
	if dropped > 0 {
		s.logger.Info("dropped partitions of rollup_outbox whose flushes JetStream acknowledged", "partitions", dropped)
	}
	return dropped, nil
}
