package proxy

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// TestListenerClosesIdleConnections: a connection given back after a detached stream serves
// a next request that comes within the client idle timeout, and is closed once it waits
// longer, as net/http closes its own idle ones; nothing of it stays parked.
func TestListenerClosesIdleConnections(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{}), func(c *Config) { c.ClientIdleTimeout = 400 * time.Millisecond })
	parked := func() int {
		r.p.ln.mu.Lock()
		defer r.p.ln.mu.Unlock()
		return len(r.p.ln.parked)
	}
	conn, br, resp := rawStream(t, r, "")
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	r.cap.next(t)
	waitFor(t, "connection waiting in the watcher", func() bool { return parked() == 1 })

	// Within the timeout: the next request is served on the same connection.
	time.Sleep(100 * time.Millisecond)
	body := chatBody(false, "")
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(body), body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("next request: %v %v", resp, err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	r.cap.next(t)

	// Another detached stream, then silence: the proxy hangs up.
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nX-Fakellm-TPOT: 10ms\r\nX-Fakellm-Tokens: 10\r\nContent-Length: %d\r\n\r\n%s", chatPath, len(chatBody(true, "")), chatBody(true, ""))
	if resp, err = http.ReadResponse(br, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	r.cap.next(t)
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("%d bytes, %v; want the idle connection closed", n, err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("closed after %v", waited)
	}
	waitFor(t, "nothing parked", func() bool { return parked() == 0 })
}
