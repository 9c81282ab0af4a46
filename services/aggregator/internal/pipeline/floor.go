package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

// FloorBucket is the JetStream key-value bucket holding each pipeline's replay floor: the
// stream position through which everything it consumed is stored in ClickHouse (or was
// invalid). A start replays from the position after it.
//
// The floor is kept here, not as the consumer's acknowledgements, because holding
// acknowledgements for window + lateness makes nats-server keep a pending entry per
// message and rewrite them all into the consumer's state about ten times a second:
// ~0.5 core at 10k events/s with the default 45 s held (BenchmarkHeldAcks in pkg/bus).
// The consumer acknowledges nothing (AckNone); the floor is saved after each flush is
// stored, so it is never ahead of ClickHouse, and a floor left behind by a crash only
// replays events the ledger then skips. The floor is saved only once JetStream has
// acknowledged the rollups of every flush below it; <stream>.<consumer>.acked holds the
// number of the last flush it acknowledged (see outbox).
const FloorBucket = "AGGREGATOR"

// floorStore is one pipeline's floor in FloorBucket, keyed <stream>.<consumer>.
type floorStore struct {
	kv  jetstream.KeyValue
	key string
}

func openFloor(ctx context.Context, js jetstream.JetStream, stream, consumer string, replicas int) (*floorStore, error) {
	kv, err := bus.EnsureKeyValue(ctx, js, FloorBucket, "tokenscope aggregator: stream position stored through, per stream and consumer", replicas)
	if err != nil {
		return nil, err
	}
	return &floorStore{kv: kv, key: stream + "." + consumer}, nil
}

// unreadyWait is how long a read at start waits for a bucket or stream that answers no one:
// one just made on a NATS cluster does until its replicas have elected a leader.
const unreadyWait = 30 * time.Second

// whenReady calls read until it returns anything but nats.ErrNoResponders, for up to
// unreadyWait, and returns what it returned last.
func whenReady[T any](ctx context.Context, read func() (T, error)) (T, error) {
	v, err := read()
	for deadline := time.Now().Add(unreadyWait); errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		v, err = read()
	}
	return v, err
}

// load returns the stored floor, 0 when none is stored.
func (f *floorStore) load(ctx context.Context) (uint64, error) {
	e, err := whenReady(ctx, func() (jetstream.KeyValueEntry, error) { return f.kv.Get(ctx, f.key) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cannot read the floor %s/%s: %w", FloorBucket, f.key, err)
	}
	v, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("the floor %s/%s holds %q, not a stream position", FloorBucket, f.key, truncate(e.Value()))
	}
	return v, nil
}

// save stores seq; it returns once JetStream has it.
func (f *floorStore) save(ctx context.Context, seq uint64) error {
	if _, err := f.kv.Put(ctx, f.key, strconv.AppendUint(nil, seq, 10)); err != nil {
		return fmt.Errorf("cannot save the floor %s/%s: %w", FloorBucket, f.key, err)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}
