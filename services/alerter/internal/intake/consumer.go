package intake

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

// ResumeConsumer returns the durable consumer cfg describes, reset to its ack floor when it
// exists already, and the last stream sequence it had delivered before (0 when new).
//
// A consumer redelivers an unacknowledged message only after AckWait, and after newer
// messages: the windows a stopped alerter held while they settled would come back behind
// windows published since, be evaluated out of order or counted late. Starting again from
// the ack floor delivers them first, in stream order. Rollups past the floor that were
// acknowledged already come again too; those of windows up to the checkpoint are
// acknowledged without a second evaluation.
func ResumeConsumer(ctx context.Context, js jetstream.JetStream, cfg bus.ConsumerConfig) (jetstream.Consumer, uint64, error) {
	var floor, delivered uint64
	existed := false
	if c, err := js.Consumer(ctx, cfg.Stream, cfg.Durable); err == nil {
		info := c.CachedInfo()
		floor, delivered, existed = info.AckFloor.Stream, info.Delivered.Stream, true
		if err := js.DeleteConsumer(ctx, cfg.Stream, cfg.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, 0, fmt.Errorf("cannot reset consumer %s on %s: %w", cfg.Durable, cfg.Stream, err)
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, 0, fmt.Errorf("cannot look up consumer %s on %s: %w", cfg.Durable, cfg.Stream, err)
	}
	if existed {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, floor+1
	}
	cons, err := bus.EnsureConsumer(ctx, js, cfg)
	if err != nil {
		return nil, 0, err
	}
	return cons, delivered, nil
}

// Reopener makes the intake's consumer again once it is gone: deleted, or deleted with its
// stream and the stream made again (an operator recreating ROLLUPS with other limits, a
// NATS store lost). Without it the subscription ended and the alerter read nothing more,
// alerting on nothing, until restarted.
type Reopener struct {
	js      jetstream.JetStream
	cfg     bus.ConsumerConfig
	limits  bus.StreamLimits
	streams []string  // made again with limits when missing, as at start
	created time.Time // the stream's creation time when last seen
	missing time.Time // when a stream was first found missing (zero: none is)
	// next is the first stream sequence past the consumer's ack floor as last made or looked
	// up (0: unknown), where one made again before anything was read starts: made again as
	// cfg says (DeliverNew), it skipped the rollups published while it was gone, and from
	// past what it had delivered, those a process that died had not acknowledged.
	next uint64
}

// deletedSettle is how long a stream found missing is left before it is made again. A stream
// made again at once, while nats-server still removes the deleted one's store, can come up
// with the old one's sequences and never acknowledge a publish.
const deletedSettle = 2 * time.Second

// settleDeleted fails, for the intake to try again later, until deletedSettle has passed
// since one of the streams was first found missing.
func (r *Reopener) settleDeleted(ctx context.Context) error {
	for _, name := range r.streams {
		_, err := r.js.Stream(ctx, name)
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if r.missing.IsZero() {
			r.missing = time.Now()
		}
		if wait := deletedSettle - time.Since(r.missing); wait > 0 {
			return fmt.Errorf("stream %s is gone; it is made again %s after that was seen, once nats-server has removed it", name, deletedSettle)
		}
		break
	}
	r.missing = time.Time{}
	return nil
}

// NewReopener returns a Reopener of the consumer cfg describes, on its stream as it is now.
// Before making the consumer again it makes its stream, and the other streams named (those
// the service ensures at start: a NATS that lost its store lost them all), with limits
// where they are missing.
func NewReopener(ctx context.Context, js jetstream.JetStream, cfg bus.ConsumerConfig, limits bus.StreamLimits, streams ...string) (*Reopener, error) {
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("cannot read stream %s: %w", cfg.Stream, err)
	}
	r := &Reopener{js: js, cfg: cfg, limits: limits, streams: append([]string{cfg.Stream}, streams...), created: s.CachedInfo().Created}
	if c, err := s.Consumer(ctx, cfg.Durable); err == nil {
		r.next = c.CachedInfo().AckFloor.Stream + 1
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("cannot look up consumer %s on %s: %w", cfg.Durable, cfg.Stream, err)
	}
	return r, nil
}

// Reopen returns the consumer, made again where it is gone, reading from stream sequence
// from (0: where the consumer last made or looked up started, else as cfg says), and whether the stream is another one than before (made again
// since): then its sequences start again, and the consumer reads it from its first message.
// seen is the highest sequence read from the stream before: a stream whose last message is
// below it is another one too.
func (r *Reopener) Reopen(ctx context.Context, from, seen uint64) (jetstream.Consumer, bool, error) {
	if err := r.settleDeleted(ctx); err != nil {
		return nil, false, err
	}
	if err := bus.EnsureStreams(ctx, r.js, r.limits, r.streams...); err != nil {
		return nil, false, err
	}
	s, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return nil, false, fmt.Errorf("cannot read stream %s: %w", r.cfg.Stream, err)
	}
	info := s.CachedInfo()
	another := !info.Created.Equal(r.created) || info.State.LastSeq < seen
	if c, err := s.Consumer(ctx, r.cfg.Durable); err == nil {
		r.created = info.Created
		return c, another, nil
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, false, fmt.Errorf("cannot look up consumer %s on %s: %w", r.cfg.Durable, r.cfg.Stream, err)
	}
	cfg := r.cfg
	switch {
	case another:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverAllPolicy, 0
	case from > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	case r.next > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, r.next
	}
	c, err := bus.EnsureConsumer(ctx, r.js, cfg)
	if err != nil {
		return nil, false, err
	}
	r.created = info.Created
	r.next = c.CachedInfo().AckFloor.Stream + 1
	return c, another, nil
}
