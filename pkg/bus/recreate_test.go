package bus_test

import (
	"context"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestEnsureStreamsRightAfterDelete deletes a stream and ensures it again at once, over and
// over: nats-server may answer "error creating store for stream" (10049) until it has removed
// the deleted one's store, and EnsureStreams waits that out. The stream is made and takes
// messages each time. (It may hold the deleted one's messages: nats-server 2.15 can recover
// them from the store it has not yet removed.)
func TestEnsureStreamsRightAfterDelete(t *testing.T) {
	_, js := testbed.JetStream(t)
	ctx := context.Background()
	limits := bus.StreamLimits{MaxBytes: 1 << 20, DuplicateWindow: time.Minute, Replicas: 1}
	if err := bus.EnsureStreams(ctx, js, limits, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		for range 5 {
			if _, err := js.Publish(ctx, "llm.req.prod.chat", []byte("{}")); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		if i%2 == 0 { // a deleted message and a purge: the store has more to remove
			s, err := js.Stream(ctx, events.StreamEvents)
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if err := s.DeleteMsg(ctx, s.CachedInfo().State.LastSeq); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			if err := s.Purge(ctx); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		if err := js.DeleteStream(ctx, events.StreamEvents); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if err := bus.EnsureStreams(ctx, js, limits, events.StreamEvents); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if _, err := js.Stream(ctx, events.StreamEvents); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	if _, err := js.Publish(ctx, "llm.req.prod.chat", []byte("{}")); err != nil {
		t.Fatal(err)
	}
}
