package pipeline

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
