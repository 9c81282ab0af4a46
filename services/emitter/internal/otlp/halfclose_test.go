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

// TestHalfClosedExporterAnsweredStored: as for the ingest, an OTLP/HTTP client that closes its
// write side once its request is sent (net/http then cancels the request's context) is
// answered with a success once its events are stored.
func TestHalfClosedExporterAnsweredStored(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	pub, _ := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{Linger: 20 * time.Millisecond}, events.StreamEvents)
	logger := slog.New(slog.DiscardHandler)
	r := New(Options{Labels: DefaultLabels(), MaxBytes: 1 << 20}, pub, func() time.Time { return testStart.Add(time.Minute) }, nil, logger)
	ts := httptest.NewServer(r)
	defer ts.Close()
	body := protoOf(t, batchOf(3, nil))
	for _, ack := range []string{"buffered", ""} {
		code, b, err := postHalfClosed(ts.Listener.Addr().String(), body, ack)
		if err != nil {
			t.Fatalf("ack %q: %v", ack, err)
		}
		t.Logf("ack %q: %d %q", ack, code, b)
		if code >= 300 {
			t.Errorf("ack %q: a half-closed exporter got %d, want a success", ack, code)
		}
	}
}

// postHalfClosed posts body to /v1/traces at addr (with X-Tokenscope-Ack: ack unless empty),
// closes its write side, and reads the answer.
func postHalfClosed(addr string, body []byte, ack string) (int, []byte, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	head := "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nConnection: close\r\n"
	if ack != "" {
		head += "X-Tokenscope-Ack: " + ack + "\r\n"
	}
	_, _ = io.WriteString(conn, head+fmt.Sprintf("Content-Length: %d\r\n\r\n", len(body)))
	_, _ = conn.Write(body)
	_ = conn.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, nil, err
	}
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
