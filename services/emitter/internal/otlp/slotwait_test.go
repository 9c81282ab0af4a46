package otlp

import (
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestHalfClosedExporterWaitingForASlot: an OTLP/HTTP exporter that half-closes
// once its request is sent (net/http then ends the request's context) while every decode
// slot is busy gets a retryable answer, or a success once its spans are stored; never a
// success for spans never published (a handler returning without writing would have
// net/http answer 200 with an empty body, which an exporter takes as success).
func TestHalfClosedExporterWaitingForASlot(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	pub, _ := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{Linger: 20 * time.Millisecond}, events.StreamEvents)
	logger := slog.New(slog.DiscardHandler)
	r := New(Options{Labels: DefaultLabels(), MaxBytes: 1 << 20, StoreWait: 3 * time.Second}, pub, func() time.Time { return testStart.Add(time.Minute) }, nil, logger)
	ts := httptest.NewServer(r)
	defer ts.Close()
	// Every decode slot busy (other exports being decoded).
	for range cap(r.slots) {
		r.slots <- struct{}{}
	}
	defer func() {
		for range cap(r.slots) {
			<-r.slots
		}
	}()
	body := protoOf(t, batchOf(3, nil))
	code, b, err := postHalfClosed(ts.Listener.Addr().String(), body, "")
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	t.Logf("answer %d %q", code, b)
	if code < 300 {
		t.Errorf("a half-closed exporter whose spans were never published got %d %q, a success: the spans are lost", code, b)
	}
}
