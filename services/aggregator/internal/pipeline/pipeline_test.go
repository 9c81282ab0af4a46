package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestConsumerFilter: a filter that is the stream's one subject is dropped, so nats-server
// takes its unfiltered path; a narrower filter is kept, and the consumer sees only its share.
func TestConsumerFilter(t *testing.T) {
	_, js := testbed.JetStream(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ filter, want string }{
		{events.SubjectRequestsAll, ""},
		{"llm.req.prod.>", "llm.req.prod.>"},
	} {
		got, err := consumerFilter(ctx, js, events.StreamEvents, c.filter)
		if err != nil || got != c.want {
			t.Errorf("consumerFilter(%q) = %q, %v; want %q", c.filter, got, err, c.want)
		}
	}
	if _, err := consumerFilter(ctx, js, "NO_SUCH_STREAM", events.SubjectRequestsAll); err == nil {
		t.Error("a missing stream gave no error")
	}

	for _, subj := range []string{"llm.req.prod.chat", "llm.req.dev.chat", "llm.req.prod.code"} {
		if _, err := js.Publish(ctx, subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	cons, _, _, err := resetConsumer(ctx, js, Options{Stream: events.StreamEvents, Filter: "llm.req.prod.>", Consumer: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if n := cons.CachedInfo().NumPending; n != 2 {
		t.Errorf("the llm.req.prod.> consumer has %d messages pending, want 2", n)
	}
	cons, _, _, err = resetConsumer(ctx, js, Options{Stream: events.StreamEvents, Filter: events.SubjectRequestsAll, Consumer: "all"})
	if err != nil {
		t.Fatal(err)
	}
	if n := cons.CachedInfo().NumPending; n != 3 {
		t.Errorf("the llm.req.> consumer has %d messages pending, want 3", n)
	}
}

// TestFloor: the replay floor is stored per stream and consumer, read back, and decides where
// a reset consumer starts; a consumer left acknowledging cumulatively gives its ack floor, and
// an AckNone consumer's (only what it delivered) is never trusted.
func TestFloor(t *testing.T) {
	_, js := testbed.JetStream(t)
	ctx := context.Background()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := js.Publish(ctx, "llm.req.prod.chat", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	o := Options{Stream: events.StreamEvents, Filter: events.SubjectRequestsAll, Consumer: "agg"}

	// Nothing stored: everything is delivered, and nothing is acknowledged.
	cons, floor, store, err := resetConsumer(ctx, js, o)
	if err != nil {
		t.Fatal(err)
	}
	info := cons.CachedInfo()
	if floor != 0 || info.NumPending != 10 || info.Config.AckPolicy != jetstream.AckNonePolicy {
		t.Fatalf("fresh: floor %d, %d pending, ack policy %v", floor, info.NumPending, info.Config.AckPolicy)
	}
	// Delivering moves an AckNone consumer's ack floor; a reset must not take it.
	it, err := cons.Messages()
	if err != nil {
		t.Fatal(err)
	}
	for range 8 {
		if _, err := it.Next(); err != nil {
			t.Fatal(err)
		}
	}
	it.Stop()
	if err := store.save(ctx, 3); err != nil {
		t.Fatal(err)
	}
	cons, floor, store, err = resetConsumer(ctx, js, o)
	if err != nil {
		t.Fatal(err)
	}
	if info := cons.CachedInfo(); floor != 3 || info.NumPending != 7 {
		t.Fatalf("after saving 3: floor %d, %d pending; want 3 and 7", floor, info.NumPending)
	}

	// A durable consumer of an earlier version, acknowledged through 6: its floor wins over 3,
	// and it is deleted.
	legacy, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{Durable: "agg", AckPolicy: jetstream.AckAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := legacy.Fetch(6)
	if err != nil {
		t.Fatal(err)
	}
	var last jetstream.Msg
	for m := range batch.Messages() {
		last = m
	}
	if err := last.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if _, floor, _, err = resetConsumer(ctx, js, o); err != nil || floor != 6 {
		t.Fatalf("legacy consumer acknowledged through 6: floor %d, %v", floor, err)
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, "agg"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatalf("the legacy durable consumer is still there: %v", err)
	}

	// Another consumer's floor is its own.
	if _, floor, _, err := resetConsumer(ctx, js, Options{Stream: o.Stream, Filter: o.Filter, Consumer: "other"}); err != nil || floor != 0 {
		t.Fatalf("other consumer: floor %d, %v", floor, err)
	}

	// A value that is not a position stops the start with an error naming the key.
	kv, err := js.KeyValue(ctx, FloorBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.StreamEvents+".agg", []byte("soon")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := resetConsumer(ctx, js, o); err == nil || !strings.Contains(err.Error(), "AGGREGATOR/LLM_EVENTS.agg") {
		t.Fatalf("garbage floor: %v", err)
	}
}

// TestCheckPositions: a floor or ledger past every position the stream has held is refused
// (the stream was made again); a purge or a deleted last message keeps the positions and is
// no reason, and neither is a stream made again with its first sequence past the floor.
// untilStoreRemoved runs create, a stream made again right after its deletion, until
// nats-server has removed the deleted one's store: until then it answers "error creating
// store for stream" (JetStream error 10049).
func untilStoreRemoved(t *testing.T, create func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := create()
		var apiErr *jetstream.APIError
		if err == nil {
			return
		}
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10049 || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestCheckPositions(t *testing.T) {
	_, js := testbed.JetStream(t)
	ctx := context.Background()
	limits := bus.StreamLimits{}
	if err := bus.EnsureStreams(ctx, js, limits, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	o := Options{Stream: events.StreamEvents, Filter: events.SubjectRequestsAll, Consumer: "agg"}
	for range 5 {
		if _, err := js.Publish(ctx, "llm.req.prod.chat", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	check := func(floor, ledger uint64, wantErr bool) {
		t.Helper()
		err := checkPositions(ctx, js, o, floor, ledger)
		if (err != nil) != wantErr || (err != nil && !strings.Contains(err.Error(), "AGG_CONSUMER")) {
			t.Errorf("checkPositions(floor %d, ledger %d) = %v, want an error: %v", floor, ledger, err, wantErr)
		}
	}
	check(0, 0, false)
	check(5, 5, false)
	check(6, 0, true)
	check(3, 6, true)
	s, err := js.Stream(ctx, o.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(ctx, 5); err != nil {
		t.Fatal(err)
	}
	check(5, 5, false)
	if err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	check(5, 5, false)
	// Made again: positions from 1.
	if err := js.DeleteStream(ctx, o.Stream); err != nil {
		t.Fatal(err)
	}
	untilStoreRemoved(t, func() error { return bus.EnsureStreams(ctx, js, limits, events.StreamEvents) })
	if _, err := js.Publish(ctx, "llm.req.prod.chat", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	check(5, 5, true)
	// Made again with its first sequence past the floor, as the error advises, then updated
	// by a start as every start does.
	if err := js.DeleteStream(ctx, o.Stream); err != nil {
		t.Fatal(err)
	}
	cfg := bus.StreamConfigs(limits)[0]
	if cfg.Name != events.StreamEvents {
		t.Fatalf("first stream config is %s", cfg.Name)
	}
	cfg.FirstSeq = 6
	untilStoreRemoved(t, func() error { _, err := js.CreateStream(ctx, cfg); return err })
	if err := bus.EnsureStreams(ctx, js, limits, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	check(5, 5, false)
	if ack, err := js.Publish(ctx, "llm.req.prod.chat", []byte("{}")); err != nil || ack.Sequence != 6 {
		t.Fatalf("first message of the stream made again: %+v, %v; want position 6", ack, err)
	}
}
