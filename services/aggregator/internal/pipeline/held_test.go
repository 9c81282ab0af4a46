package pipeline

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
)

// lostClock is a Held whose Err says lost while its Done is still open, as the lease's is
// between its deadline and the late timer of a process that was paused past it.
type lostClock struct{ context.Context }

func (lostClock) Err() error { return context.Canceled }

func (l lostClock) Value(key any) any { return l.Context.Value(key) }

// countedFlush records its writes.
type countedFlush struct{ writes int }

func (*countedFlush) empty() bool                              { return false }
func (f *countedFlush) write(context.Context, time.Time) error { f.writes++; return nil }
func (*countedFlush) messages() []sink.OutboxMsg               { return nil }
func (*countedFlush) id() sink.Ledger                          { return sink.Ledger{SeqThrough: 1, FlushID: "f"} }
func (*countedFlush) done(time.Time)                           {}
func (*countedFlush) count() int                               { return 1 }

// TestNoWriteOnceHeldSaysLost: every write asks Held itself, not only a context made from
// it, which hears of the end only once the lease's timer has run.
func TestNoWriteOnceHeldSaysLost(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry()).forStream("S")
	held, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	p := &Pipeline{opts: Options{Held: lostClock{held}, WriteTimeout: time.Second, Clock: time.Now}, m: m, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	f := &countedFlush{}
	if p.write(context.Background(), &cutFlush{flush: f}) {
		t.Fatal("write reported the flush stored")
	}
	if f.writes != 0 {
		t.Fatalf("%d writes to ClickHouse after Held said the lease is lost", f.writes)
	}
	if p.publish(context.Background(), []sink.OutboxMsg{{Subject: "s", ID: "i"}}) {
		t.Fatal("publish went on after Held said the lease is lost")
	}
}

// inWatermarkStage is a stage in the watermark that holds nothing.
type inWatermarkStage struct{}

func (inWatermarkStage) handle([]byte, uint64, time.Time, time.Time) (result, error) {
	return resAdded, nil
}
func (inWatermarkStage) cut(time.Time, uint64) flush { return &countedFlush{} }
func (inWatermarkStage) held() (uint64, bool)        { return 0, false }
func (inWatermarkStage) buffered() int               { return 0 }
func (inWatermarkStage) full() bool                  { return false }
func (inWatermarkStage) observe(time.Time)           {}
func (inWatermarkStage) inWatermark() bool           { return true }
func (inWatermarkStage) resume(time.Time)            {}

// unreachableJS answers no look-up: its context ended (the lease lost while the pipelines
// were being set up).
type unreachableJS struct{ jetstream.JetStream }

func (unreachableJS) Stream(ctx context.Context, _ string) (jetstream.Stream, error) {
	return nil, ctx.Err()
}

// TestSetUpCutShortHoldsNothing: the lease ended while a term's pipelines were set up, after
// one had taken its hold on the watermark (rollups to publish again) and before it ran: the
// process stands by, and watermark_held must not read 1 meanwhile, nor after, in a term whose
// pipeline holds nothing (only Run, which the lost term's joins before the next starts, sets
// the gauges of what a pipeline holds).
func TestSetUpCutShortHoldsNothing(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry()).forStream("S")
	held, lose := context.WithCancel(context.Background())
	lose()
	p := &Pipeline{opts: Options{Stream: "S", Held: held}, js: unreachableJS{}, stage: inWatermarkStage{}, m: m, logger: discardLogger(),
		outbox: outbox{replay: []sink.OutboxMsg{{Subject: "s", ID: "i"}}}}
	w := NewWatermarks(&jsRecorder{}, &rollupQueue{}, "agg", 15*time.Second, prometheus.NewRegistry(), discardLogger())
	if err := p.PublishWatermarks(held, w); err == nil {
		t.Fatal("PublishWatermarks looked up the stream with its context ended")
	}
	if v := testutil.ToFloat64(m.watermarkHeld); v != 0 {
		t.Fatalf("watermark_held = %v for a pipeline that never ran, want 0", v)
	}
}
