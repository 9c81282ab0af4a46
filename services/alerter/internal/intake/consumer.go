package intake

import (
	"context"
	"errors"
	"fmt"

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
