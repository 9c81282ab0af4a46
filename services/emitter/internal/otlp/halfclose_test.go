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
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
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
			t.Fatalf("ack %q: %v", ack, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		t.Logf("ack %q: %d %q", ack, resp.StatusCode, b)
		if resp.StatusCode >= 300 {
			t.Errorf("ack %q: a half-closed exporter got %d, want a success", ack, resp.StatusCode)
		}
	}
}
