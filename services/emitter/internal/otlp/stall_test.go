package otlp

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// TestStalledRequests: an OTLP/HTTP body that stops arriving, or an OTLP/gRPC call whose
// message never comes, is given up once the idle timeout passes, and gives back what it
// held of the budget; before, each held its memory (a gRPC call twice
// EMITTER_OTLP_MAX_BYTES) for as long as the client kept it open, and a few of them took
// the whole budget from every other request.
func TestStalledRequests(t *testing.T) {
	const idle = 300 * time.Millisecond
	budget := reqbody.NewBudget(64<<20, nil)
	r := New(Options{Labels: DefaultLabels(), MaxBytes: 1 << 20, Budget: budget, BodyIdle: idle}, &pubRecorder{},
		func() time.Time { return testStart.Add(time.Minute) }, nil, slog.New(slog.DiscardHandler))
	srv, err := r.Listen("127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, time.Second) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	released := func(what string) {
		t.Helper()
		for i := 0; budget.Held() != 0 && i < 200; i++ {
			time.Sleep(10 * time.Millisecond)
		}
		if budget.Held() != 0 {
			t.Fatalf("%s: %d bytes of the budget still held", what, budget.Held())
		}
	}

	body := protoOf(t, batchOf(4, nil))
	for _, head := range []string{fmt.Sprintf("Content-Length: %d\r\n", len(body)), "Transfer-Encoding: chunked\r\n"} {
		c, err := net.Dial("tcp", srv.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\n%s\r\n", contentProto, head)
		part := body[:10]
		if head[0] == 'T' {
			part = fmt.Appendf(nil, "%x\r\n%s\r\n", 10, body[:10])
		}
		if _, err := c.Write(part); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(idle + 5*time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: no answer: %v (held %d)", head, err, budget.Held())
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("%s: status %d, want 408", head, resp.StatusCode)
		}
		released("OTLP/HTTP " + head)
	}

	// A gRPC call opened and never sent its message.
	cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	sctx, scancel := context.WithCancel(context.Background())
	defer scancel()
	stream, err := cc.NewStream(sctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
		"/opentelemetry.proto.collector.trace.v1.TraceService/Export", grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; budget.Held() != 2<<20 && i < 200; i++ { // the server has the call
		time.Sleep(10 * time.Millisecond)
	}
	if budget.Held() != 2<<20 {
		t.Fatalf("a call holds %d of the budget", budget.Held())
	}
	var reply []byte
	errc := make(chan error, 1)
	go func() { errc <- stream.RecvMsg(&reply) }()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a call without its message answered")
		}
		t.Logf("gRPC: %v", err)
	case <-time.After(idle + 5*time.Second):
		t.Fatalf("a call without its message not given up (held %d)", budget.Held())
	}
	released("OTLP/gRPC")
}
