package ingest

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestStoredPartIsNotASuccess: under the default (stored) acknowledgement, a batch of which
// some valid events found no room in the publisher within StoreWait is answered 503 with
// Retry-After, whatever became of the part taken: a success would tell the client that the
// rest, rejected as dropped, need not be sent again.
func TestStoredPartIsNotASuccess(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	// A small buffer, as a busy emitter's is when others' events fill it.
	pub, _ := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 8, Batch: 8}, events.StreamEvents)
	logger := slog.New(slog.DiscardHandler)
	h := New(Options{MaxBytes: 64 << 20, StoreWait: 100 * time.Millisecond}, pub, time.Now, nil, logger)
	stamp := time.Now().UTC().Format(events.TimeLayout)
	var sb strings.Builder
	const n = 30000
	for i := range n {
		fmt.Fprintf(&sb, `{"v":1,"event_id":"p-%d","ts":%q,"model":"m","scene":"chat","env":"prod","input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":2,"status":"ok"}`+"\n", i, stamp)
	}
	for try := range 5 {
		req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(sb.String()))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var a Answer
		_ = json.Unmarshal(rec.Body.Bytes(), &a)
		t.Logf("try %d: %d accepted %d stored %d rejected %d error %q first item error %v", try, rec.Code, a.Accepted, a.Stored, a.Rejected, a.Error, a.Errors[:min(1, len(a.Errors))])
		if rec.Code < 300 && a.Stored < n {
			t.Fatalf("answered %d (a success) with %d of %d valid events stored and the rest dropped", rec.Code, a.Stored, n)
		}
	}
}
