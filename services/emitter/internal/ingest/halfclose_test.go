package ingest

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
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

// TestHalfClosedClientAnsweredStored: a client that sends its whole request and then closes its
// write side (shutdown(SHUT_WR), as `nc -N`, shell scripts and some HTTP/1.0 clients do)
// still reads the answer, and is answered as stored once its events are: net/http cancels
// the request's context when it reads EOF after the body, and the wait for JetStream's acks
// outlives that context (bounded by StoreWait).
func TestHalfClosedClientAnsweredStored(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	// The emitter's default linger: the acks come some milliseconds after the body.
	pub, _ := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{Linger: 20 * time.Millisecond}, events.StreamEvents)
	logger := slog.New(slog.DiscardHandler)
	h := New(Options{MaxBytes: 1 << 20}, pub, time.Now, nil, logger)
	ts := httptest.NewServer(h)
	defer ts.Close()
	stamp := time.Now().UTC().Format(events.TimeLayout)
	for _, ack := range []string{"buffered", "stored", ""} {
		body := fmt.Sprintf(`{"v":1,"event_id":"hc-%s","ts":%q,"model":"m","scene":"chat","env":"prod","input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":2,"status":"ok"}`, ack, stamp)
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		head := "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
		if ack != "" {
			head += "X-Tokenscope-Ack: " + ack + "\r\n"
		}
		_, _ = io.WriteString(conn, head+fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body))
		_ = conn.(*net.TCPConn).CloseWrite()
		_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("ack %q: %v", ack, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		t.Logf("ack %q: %d %s", ack, resp.StatusCode, strings.TrimSpace(string(b)))
		if resp.StatusCode >= 300 {
			t.Errorf("ack %q: a half-closed client got %d %s, want a success", ack, resp.StatusCode, b)
		}
	}
}
