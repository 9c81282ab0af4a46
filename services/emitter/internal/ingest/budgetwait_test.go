package ingest

import (
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
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// TestStoredWaitGivesTheBodyBudgetBack: while NATS is away, an ingest request answered once
// stored (the default) gives its body's share of EMITTER_MAX_PARSE_MEMORY back once its
// events are copied into the publisher, not after its wait for the acks: the budget is the
// proxy's too, and a NATS outage with ingest traffic must not make the gateway forward LLM
// requests unread.
func TestStoredWaitGivesTheBodyBudgetBack(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	pub, js := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{}, events.StreamEvents)
	nc := js.Conn()
	srv.Shutdown()
	srv.WaitForShutdown()
	waitFor(t, func() bool { return !nc.IsConnected() })
	logger := slog.New(slog.DiscardHandler)
	budget := reqbody.NewBudget(4<<20, nil) // shared with the proxy in the emitter
	h := New(Options{MaxBytes: 16 << 20, Budget: budget, StoreWait: 3 * time.Second}, pub, time.Now, nil, logger)
	stamp := time.Now().UTC().Format(events.TimeLayout)
	n := 0
	body := func(k string) string {
		var sb strings.Builder
		n = 0
		for i := 0; sb.Len() < 3<<20; i++ {
			n++
			// A client's own fields beside the contract's: dropped from the canonical event.
			fmt.Fprintf(&sb, `{"v":1,"event_id":"%s-%d","ts":%q,"model":"m","scene":"chat","env":"prod","input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":2,"status":"ok","app_debug":%q}`+"\n", k, i, stamp, strings.Repeat("x", 2000))
		}
		return sb.String()
	}
	for _, ack := range []string{"buffered", "stored"} {
		answered := make(chan int, 1)
		before := pub.Buffered()
		b := body(ack)
		go func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(b))
			req.Header.Set("X-Tokenscope-Ack", ack)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			answered <- rec.Code
		}()
		waitFor(t, func() bool { return pub.Buffered() >= before+n }) // every event of it queued
		time.Sleep(200 * time.Millisecond)
		held := budget.Held()
		t.Logf("ack %s: %d bytes of the body budget held 200ms after all its events were queued (publisher holds %d bytes)", ack, held, pub.BufferedBytes())
		if ack == "stored" && !budget.Reserve(2<<20) {
			t.Errorf("ack stored, NATS away: a 2 MiB proxy body cannot be reserved (budget 4 MiB, %d held by an ingest request only waiting for acks)", held)
		}
		code := <-answered
		t.Logf("ack %s: answered %d", ack, code)
		budget.Release(budget.Held())
	}
}
