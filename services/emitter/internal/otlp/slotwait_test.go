package otlp

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
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
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	head := "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nConnection: close\r\n"
	_, _ = io.WriteString(conn, head+fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)))
	_, _ = conn.Write(body)
	_ = conn.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	t.Logf("answer %d %q", resp.StatusCode, b)
	if resp.StatusCode < 300 {
		t.Errorf("a half-closed exporter whose spans were never published got %d %q, a success: the spans are lost", resp.StatusCode, b)
	}
}
