package pipeline

import (
	"context"
	"strconv"
	"time"

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

	replay  []sink.OutboxMsg // read at start: the rollups to publish again
	flushes int              // how many flushes they are
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
	if p.marks != nil {
		p.marks.release(p.opts.Stream)
	}
	return true
}

// saveMark stores the acked mark when it moved. A failure is counted and logged; the next
// cycle tries again, and a start meanwhile publishes again rollups JetStream already has
// (dropped as duplicates within its duplicate window).
func (p *Pipeline) saveMark(ctx context.Context) {
	o := &p.outbox
	if o.mark == nil || o.acked <= o.saved {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := o.mark.save(sctx, o.acked); err != nil {
		p.m.ackErrors.Inc()
		p.logger.Warn("cannot save the acked mark; the next flush tries again", "err", err)
		return
	}
	o.saved = o.acked
}
