package testbed_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// TestBothServers starts the real NATS and ClickHouse, sends a request event through
// JetStream (its duplicate, same Nats-Msg-Id, is dropped), and stores it in ClickHouse
// through the migrator's requests table.
func TestBothServers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := testbed.NATS(t)
	chCfg := testbed.ClickHouse(t)

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	limits := bus.StreamLimits{MaxBytes: 64 << 20, DuplicateWindow: time.Minute, Replicas: 1}
	if err := bus.EnsureStreams(ctx, js, limits); err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js, limits); err != nil { // idempotent
		t.Fatal(err)
	}

	ev := events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: time.Now().UTC().Truncate(time.Millisecond),
		Model: "qwen2.5-72b", Scene: "chat", Env: "prod", InputTokens: 900, OutputTokens: 51,
		TTFTMs: 300, TotalMs: 1300, Status: events.StatusOK, Stream: true}
	msg := &nats.Msg{Subject: events.RequestSubject(ev.Env, ev.Scene), Data: events.AppendRequest(nil, &ev), Header: nats.Header{}}
	msg.Header.Set(jetstream.MsgIDHeader, ev.EventID)
	first, err := js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	if first.Duplicate || !dup.Duplicate || dup.Sequence != first.Sequence {
		t.Fatalf("duplicate not dropped: first %+v, second %+v", first, dup)
	}

	cons, err := bus.EnsureConsumer(ctx, js, bus.ConsumerConfig{Stream: events.StreamEvents, Durable: "it", FilterSubject: events.SubjectRequestsAll})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []events.RequestEvent
	for m := range batch.Messages() {
		var e events.RequestEvent
		if err := events.UnmarshalRequest(m.Data(), &e); err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
		if err := m.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 1 || got[0].EventID != ev.EventID {
		t.Fatalf("consumed %d events, want exactly the one published", len(got))
	}

	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	b, err := db.Conn().PrepareBatch(ctx, "INSERT INTO requests (ts, event_id, env, scene, model, bucket, input_tokens, output_tokens, ttft_ms, total_ms, status)")
	if err != nil {
		t.Fatal(err)
	}
	e := got[0]
	buckets := events.DefaultBucketBounds()
	if err := b.Append(e.TS, e.EventID, e.Env, e.Scene, e.Model, buckets.Label(buckets.Index(e.InputTokens)),
		uint32(e.InputTokens), uint32(e.OutputTokens), e.TTFTMs, e.TotalMs, string(e.Status)); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	var id, bucket string
	var ttft float64
	if err := db.Conn().QueryRow(ctx, "SELECT event_id, bucket, ttft_ms FROM requests").Scan(&id, &bucket, &ttft); err != nil {
		t.Fatal(err)
	}
	if id != ev.EventID || bucket != "500-1999" || ttft != 300 {
		t.Fatalf("read back %s %s %v", id, bucket, ttft)
	}
}
