package intake

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestReopenerStartsAtTheAckFloor: an alerter that read two rollups and acked one
// stops (crash, kill); the next alerter looks the consumer up (NewReopener) and, before
// AckWait gives it the unacked rollup again, the consumer is gone. Made again with nothing
// read, it must start at the first rollup not acked: the one delivered to the alerter that
// died was never acknowledged.
func TestReopenerStartsAtTheAckFloor(t *testing.T) {
	b := newBed(t)
	cfg := rollupsConsumerConfig()
	cons, _, err := ResumeConsumer(b.ctx, b.js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := b.js.Publish(b.ctx, "rollup.tokens.prod", []byte{'{', byte('0' + i)}); err != nil {
			t.Fatal(err)
		}
	}
	// The first alerter: reads two, acks the first, dies.
	batch, err := cons.Fetch(2, jetstreamFetchWait())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		if n == 0 {
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
		n++
	}
	if n != 2 {
		t.Fatalf("fetched %d, want 2", n)
	}
	time.Sleep(100 * time.Millisecond)
	// The next alerter starts.
	re, err := NewReopener(b.ctx, b.js, cfg, limits)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.js.DeleteConsumer(b.ctx, events.StreamRollups, "alerter"); err != nil {
		t.Fatal(err)
	}
	again, _, err := re.Reopen(b.ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := again.Next(jetstreamFetchWait())
	if err != nil {
		t.Fatalf("no rollup read after the consumer was made again: %v (the unacked rollup 2 and rollup 3 are lost)", err)
	}
	meta, _ := msg.Metadata()
	if meta.Sequence.Stream != 2 {
		t.Fatalf("consumer made again starts at stream sequence %d, want 2: rollup 2, delivered to the alerter that died and never acked, is lost", meta.Sequence.Stream)
	}
}

func jetstreamFetchWait() jetstream.FetchOpt { return jetstream.FetchMaxWait(2 * time.Second) }
