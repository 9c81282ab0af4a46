package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// Feedback is one feedback event to store, at its stream position.
type Feedback struct {
	Event events.FeedbackEvent // strings cloned: the row outlives the message
	Seq   uint64
}

const feedbackColumns = `ts, event_id, request_id, conversation_id, name, value, source, env, scene, model,
comment_length, consumer, stream_seq`

// WriteFeedback inserts feedback events into feedback in one batch: a batch insert is one
// part, all or nothing.
func (c *ClickHouse) WriteFeedback(ctx context.Context, rows []Feedback) error {
	if len(rows) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO feedback ("+feedbackColumns+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into feedback: %w", err)
	}
	for i := range rows {
		e := &rows[i].Event
		if err := b.Append(e.TS, e.EventID, e.RequestID, e.ConversationID, e.Name, e.Value, string(e.Source), e.Env, e.Scene, e.Model,
			uint32(e.CommentLength), c.consumer, rows[i].Seq); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the feedback batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into feedback: %w", len(rows), err)
	}
	return nil
}

const feedbackRollupColumns = `window_start, window_seconds, kind, env, scene, model, name, source,
count, positive, late, sum, value_min, value_max, value_p50, value_p90, value_means, value_weights,
consumer, seq_through, flush_id, written_at`

// WriteFeedbackRollups inserts rows into feedback_rollups in one batch.
func (c *ClickHouse) WriteFeedbackRollups(ctx context.Context, rows []window.FeedbackRollup, l Ledger, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO feedback_rollups ("+feedbackRollupColumns+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into feedback_rollups: %w", err)
	}
	for i := range rows {
		r := &rows[i]
		if err := b.Append(r.WindowStart, uint32(r.WindowSeconds), r.Kind, r.Env, r.Scene, r.Model, r.Name, r.Source,
			r.Count, r.Positive, r.Late, r.Sum, r.Values.Min, r.Values.Max, r.Values.P50, r.Values.P90, r.Values.Means, r.Values.Weights,
			c.consumer, l.SeqThrough, l.FlushID, now); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the feedback_rollups batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into feedback_rollups: %w", len(rows), err)
	}
	return nil
}

// StoredFeedback returns, in order, the stream positions of this consumer's stored feedback
// in [lo, hi]: the feedback ledger, as StoredRequests is the requests'.
func (c *ClickHouse) StoredFeedback(ctx context.Context, lo, hi uint64) ([]uint64, error) {
	rows, err := c.conn.Query(fullRead(ctx), "SELECT stream_seq FROM feedback WHERE consumer = ? AND stream_seq >= ? AND stream_seq <= ? ORDER BY stream_seq", c.consumer, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("cannot read the feedback ledger: %w", err)
	}
	defer rows.Close()
	var seqs []uint64
	for rows.Next() {
		var seq uint64
		if err := rows.Scan(&seq); err != nil {
			return nil, fmt.Errorf("cannot read the feedback ledger: %w", err)
		}
		seqs = append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the feedback ledger: %w", err)
	}
	return seqs, nil
}

// RecentFeedbackIDs calls f with the verdict (event_id, request_id, conversation_id, name,
// source, value) and stream position of this consumer's latest n stored feedback events at or
// before stream position through, newest first, so that a restart remembers which verdicts
// it had counted by then. ev is reused between calls.
func (c *ClickHouse) RecentFeedbackIDs(ctx context.Context, n int, through uint64, f func(ev *events.FeedbackEvent, seq uint64)) error {
	rows, err := c.conn.Query(fullRead(ctx), "SELECT event_id, request_id, conversation_id, name, source, value, stream_seq FROM feedback WHERE consumer = ? AND stream_seq <= ? ORDER BY stream_seq DESC LIMIT ?", c.consumer, through, uint64(n))
	if err != nil {
		return fmt.Errorf("cannot read the stored feedback ids: %w", err)
	}
	defer rows.Close()
	var ev events.FeedbackEvent
	for rows.Next() {
		var source string
		var seq uint64
		if err := rows.Scan(&ev.EventID, &ev.RequestID, &ev.ConversationID, &ev.Name, &source, &ev.Value, &seq); err != nil {
			return fmt.Errorf("cannot read the stored feedback ids: %w", err)
		}
		ev.Source = events.FeedbackSource(source)
		f(&ev, seq)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("cannot read the stored feedback ids: %w", err)
	}
	return nil
}
