package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// held is a client's connection to one of the emitter's listeners.
type held struct {
	net.Conn
	br *bufio.Reader
}

func hold(t *testing.T, addr string) held {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return held{c, bufio.NewReader(c)}
}

// do sends one HTTP/1.1 request and reads the answer.
func (h held) do(t *testing.T, method, path, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://x"+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if err := req.Write(h.Conn); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(h.br, req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp, string(b)
}

// closed reports whether the emitter closed h.
func (h held) closed() bool {
	n, err := h.br.Read(make([]byte, 1))
	return n == 0 && err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
}

// TestConnectionLimit: EMITTER_MAX_CONNECTIONS counts HTTP_ADDR's connections and the OTLP
// receivers' together; past it a new one is refused at once on each (HTTP: 503, gRPC:
// closed), those open are served, and a connection whose stream left net/http holds one
// place until it is closed.
func TestConnectionLimit(t *testing.T) {
	httpAddr, grpcAddr, probeAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	base, _, stop := serveRigWith(t, fakellm.Options{TTFT: 5 * time.Millisecond, TPOT: 50 * time.Millisecond, Tokens: 16},
		"EMITTER_MAX_CONNECTIONS=3", "EMITTER_OTLP_HTTP_ADDR="+httpAddr, "EMITTER_OTLP_GRPC_ADDR="+grpcAddr, "EMITTER_PROBE_ADDR="+probeAddr)
	defer stop()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections() // serveRig's readiness check
	addr := strings.TrimPrefix(base, "http://")

	// A stream long enough to leave net/http (800 ms), on a connection kept alive.
	proxy := hold(t, addr)
	stream := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"a b c"}]}`
	if resp, body := proxy.do(t, "POST", "/v1/chat/completions", stream); resp.StatusCode != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	otlpHTTP := hold(t, httpAddr)
	if resp, _ := otlpHTTP.do(t, "GET", "/v1/traces", ""); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("OTLP/HTTP: %d", resp.StatusCode)
	}
	// The HTTP/2 preface, answered with the server's settings: the gRPC server has the connection.
	otlpGRPC := hold(t, grpcAddr)
	if _, err := io.WriteString(otlpGRPC, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(otlpGRPC.br, make([]byte, 9)); err != nil {
		t.Fatalf("gRPC settings: %v", err)
	}

	// Full: each listener refuses the next one.
	for _, a := range []string{addr, httpAddr} {
		c := hold(t, a)
		resp, body := c.do(t, "GET", "/healthz", "")
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !resp.Close || body != "too many connections\n" {
			t.Fatalf("%s over the limit: %d %q, Retry-After %q", a, resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
		if !c.closed() {
			t.Fatalf("%s: the refused connection is still open", a)
		}
	}
	if c := hold(t, grpcAddr); !c.closed() {
		t.Fatal("gRPC: the refused connection is still open")
	}
	// The probes' address still answers, and serves nothing but probes and scrapes.
	probe := hold(t, probeAddr)
	for path, want := range map[string]int{"/readyz": 200, "/healthz": 200, "/v1/models": 404} {
		if resp, body := probe.do(t, "GET", path, ""); resp.StatusCode != want {
			t.Fatalf("EMITTER_PROBE_ADDR %s with HTTP_ADDR full: %d %q, want %d", path, resp.StatusCode, body, want)
		}
	}
	if resp, body := proxy.do(t, "GET", "/healthz", ""); resp.StatusCode != 200 {
		t.Fatalf("on the connection given back after the stream: %d %q", resp.StatusCode, body)
	}

	otlpGRPC.Close()
	_, body := proxy.do(t, "GET", "/metrics", "")
	for _, want := range []string{
		`emitter_connections_open{listener="http"} 1`, `emitter_connections_open{listener="otlp_http"} 1`,
		`emitter_connections_refused_total{listener="http"} 1`, `emitter_connections_refused_total{listener="otlp_http"} 1`,
		`emitter_connections_refused_total{listener="otlp_grpc"} 1`, `emitter_proxy_detached_streams_total 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics has no %s", want)
		}
	}
	if !strings.Contains(body, `emitter_connections_open{listener="otlp_grpc"} `) {
		t.Error("/metrics has no emitter_connections_open for otlp_grpc")
	}
	// The gRPC place is free once the server has seen the client go.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c := hold(t, addr)
		resp, _ := c.do(t, "GET", "/healthz", "")
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a connection closed: %d", resp.StatusCode)
		}
	}
}
