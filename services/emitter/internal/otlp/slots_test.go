package otlp

import (
	"log/slog"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
)

// TestBufferedExportNotBehindStoredOnes: the decode slots (2 × GOMAXPROCS) bound the
// exports being decompressed and decoded, not those waiting for JetStream's acks: while NATS
// is away, exports waiting to be stored give their slots back, and an export with
// X-Tokenscope-Ack: buffered, which the publisher can take at once, is not held behind them.
func TestBufferedExportNotBehindStoredOnes(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	pub, _ := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{}, events.StreamEvents)
	srv.Shutdown()
	srv.WaitForShutdown()
	logger := slog.New(slog.DiscardHandler)
	const wait = 5 * time.Second
	r := New(Options{Labels: DefaultLabels(), MaxBytes: 1 << 20, StoreWait: wait}, pub, func() time.Time { return testStart.Add(time.Minute) }, nil, logger)
	slots := cap(r.slots)
	t.Logf("GOMAXPROCS %d: %d slots", runtime.GOMAXPROCS(0), slots)
	body := protoOf(t, batchOf(3, nil))
	var wg sync.WaitGroup
	for range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = post(t, r, body) // the default: stored
		}()
	}
	time.Sleep(300 * time.Millisecond) // they hold the slots, waiting for acks
	start := time.Now()
	w := post(t, r, body, emit.AckHeader, emit.AckBuffered)
	took := time.Since(start)
	wg.Wait()
	t.Logf("buffered export: %d after %s", w.Code, took)
	if took > wait/2 {
		t.Errorf("an export asking to be answered once held waited %s behind exports waiting for NATS", took)
	}
}
