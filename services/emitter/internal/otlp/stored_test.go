package otlp

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
)

// TestAckStored: an export, by default as with X-Tokenscope-Ack: stored (gRPC: its
// metadata), is answered once JetStream has stored its events, and while NATS is away with a retryable answer once
// the wait is over, never a success for events only the emitter holds.
func TestAckStored(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, js := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 10000, Batch: 64, AckTimeout: 300 * time.Millisecond}, events.StreamEvents)
	nc := js.Conn()
	logger := slog.New(slog.DiscardHandler)
	now := func() time.Time { return testStart.Add(time.Minute) }
	r := New(Options{Labels: DefaultLabels(), MaxBytes: 1 << 20, StoreWait: time.Second}, pub, now, nil, logger)
	stored := func() uint64 {
		s, err := js.Stream(ctx, events.StreamEvents)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	traceOf := func(k byte) func(int, ptrace.Span) {
		return func(_ int, s ptrace.Span) {
			tid := testTID
			tid[0] = k
			s.SetTraceID(tid)
		}
	}

	w := post(t, r, protoOf(t, batchOf(200, traceOf(1))))
	exportResponse(t, w)
	if n := stored(); n != 200 { // at the answer, not later
		t.Fatalf("answered with %d of 200 events stored", n)
	}
	w = post(t, r, protoOf(t, batchOf(100, traceOf(4))), emit.AckHeader, emit.AckStored)
	exportResponse(t, w)
	if n := stored(); n != 300 {
		t.Fatalf("answered with %d of 300 events stored", n)
	}

	// gRPC, with the metadata.
	client := ptraceotlp.NewGRPCClient(grpcRig(t, pub, "", 1<<20))
	mctx := metadata.AppendToOutgoingContext(ctx, strings.ToLower(emit.AckHeader), emit.AckStored)
	if _, err := client.Export(mctx, batchOf(100, traceOf(2))); err != nil {
		t.Fatal(err)
	}
	if n := stored(); n != 400 {
		t.Fatalf("gRPC answered with %d of 400 events stored", n)
	}
	if _, err := client.Export(ctx, batchOf(100, traceOf(5))); err != nil { // the default
		t.Fatal(err)
	}
	if n := stored(); n != 500 {
		t.Fatalf("gRPC, no metadata: answered with %d of 500 events stored", n)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	for i := 0; nc.IsConnected() && i < 500; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	away := protoOf(t, batchOf(50, traceOf(3)))
	w = post(t, r, away, emit.AckHeader, emit.AckStored)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" || !strings.Contains(rpcStatus(t, w).Message, "send the request again") {
		t.Fatalf("NATS away: %d %q", w.Code, w.Body)
	}

	testbed.StartNATS(t, filepath.Join(dir, "js"), port)
	for i := 0; !nc.IsConnected() && i < 500; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	exportResponse(t, post(t, r, away, emit.AckHeader, emit.AckStored))
	var err error
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if n := stored(); n != 550 {
		t.Fatalf("%d events stored, want 550", n)
	}

	// A publisher that cannot say what is stored: the exporter is told, not answered as if.
	w = post(t, newTestReceiver(&pubRecorder{}, "", 1<<20), away, emit.AckHeader, emit.AckStored)
	if w.Code != http.StatusBadRequest {
		t.Fatalf("pubRecorder: %d %q", w.Code, w.Body)
	}
	_, err = ptraceotlp.NewGRPCClient(grpcRig(t, &pubRecorder{}, "", 1<<20)).Export(mctx, batchOf(1, nil))
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument {
		t.Fatalf("gRPC, pubRecorder: %v", err)
	}
}
