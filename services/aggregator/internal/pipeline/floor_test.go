package pipeline

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// unreadyKV answers no one for its first gets, as a bucket just made on a NATS cluster
// does until its replicas have elected a leader.
type unreadyKV struct {
	jetstream.KeyValue
	refusals int
}

func (kv *unreadyKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if kv.refusals > 0 {
		kv.refusals--
		return nil, nats.ErrNoResponders
	}
	return nil, jetstream.ErrKeyNotFound
}

func TestFloorLoadWaitsForTheBucket(t *testing.T) {
	kv := &unreadyKV{refusals: 3}
	f := &floorStore{kv: kv, key: "LLM_EVENTS.aggregator"}
	got, err := f.load(context.Background())
	if err != nil || got != 0 || kv.refusals != 0 {
		t.Fatalf("load = %d, %v with %d refusals left; want 0, nil once the bucket answers", got, err, kv.refusals)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (&floorStore{kv: &unreadyKV{refusals: 1 << 30}, key: "k"}).load(ctx); err == nil {
		t.Fatal("load of a bucket that never answers returned no error once its context ended")
	}
}
