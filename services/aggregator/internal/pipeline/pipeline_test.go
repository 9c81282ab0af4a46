package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestConsumerFilter: a filter that is the stream's one subject is dropped, so nats-server
// takes its unfiltered path; a narrower filter is kept, and the consumer sees only its share.
func TestConsumerFilter(t *testing.T) {
	srv := testbed.NATS(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
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
	cons, _, err := resetConsumer(ctx, js, Options{Stream: events.StreamEvents, Filter: "llm.req.prod.>", Consumer: "prod", MaxAckPending: -1, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := cons.CachedInfo().NumPending; n != 2 {
		t.Errorf("the llm.req.prod.> consumer has %d messages pending, want 2", n)
	}
	cons, _, err = resetConsumer(ctx, js, Options{Stream: events.StreamEvents, Filter: events.SubjectRequestsAll, Consumer: "all", MaxAckPending: -1, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if n := cons.CachedInfo().NumPending; n != 3 {
		t.Errorf("the llm.req.> consumer has %d messages pending, want 3", n)
	}
}
