package otlp

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// rawCodec sends bytes as they are, to put malformed messages on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

func grpcRig(t *testing.T, pub Publisher, token string, maxBytes int64) *grpc.ClientConn {
	t.Helper()
	r := newTestReceiver(pub, token, maxBytes)
	srv, err := r.Listen(Off, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func TestGRPC(t *testing.T) {
	pub := &pubRecorder{}
	cc := grpcRig(t, pub, "s3cret", 1<<20)
	client := ptraceotlp.NewGRPCClient(cc)
	authed := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer s3cret")

	t.Run("partial success", func(t *testing.T) {
		req := batchOf(10, func(i int, s ptrace.Span) {
			if i == 4 {
				s.Attributes().Remove("gen_ai.latency.time_to_first_token")
			}
		})
		resp, err := client.Export(authed, req)
		if err != nil {
			t.Fatal(err)
		}
		ps := resp.PartialSuccess()
		if ps.RejectedSpans() != 1 || !strings.Contains(ps.ErrorMessage(), "gen_ai.latency.time_to_first_token") {
			t.Fatalf("partial success %d %q", ps.RejectedSpans(), ps.ErrorMessage())
		}
		if n := len(pub.events(t)); n != 9 {
			t.Fatalf("%d events published", n)
		}
	})
	for _, tc := range []struct {
		name string
		ctx  context.Context
		body []byte
		want codes.Code
	}{
		{"no token", context.Background(), protoOf(t, batchOf(1, nil)), codes.Unauthenticated},
		{"wrong token", metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer x"), protoOf(t, batchOf(1, nil)), codes.Unauthenticated},
		{"malformed protobuf", authed, []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01}, codes.Internal},
		{"too large", authed, make([]byte, 2<<20), codes.ResourceExhausted},
		// Refused before its message is read: otherwise the size would be checked first.
		{"too large without the token", context.Background(), make([]byte, 2<<20), codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(pub.msgs)
			var out []byte
			err := cc.Invoke(tc.ctx, "/opentelemetry.proto.collector.trace.v1.TraceService/Export", tc.body, &out, grpc.ForceCodec(rawCodec{}))
			if status.Code(err) != tc.want {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if len(pub.msgs) != before {
				t.Fatalf("%d events published", len(pub.msgs)-before)
			}
		})
	}
	t.Run("buffer full is retryable", func(t *testing.T) {
		pub := &pubRecorder{limit: 1}
		client := ptraceotlp.NewGRPCClient(grpcRig(t, pub, "", 0))
		if _, err := client.Export(context.Background(), batchOf(3, nil)); status.Code(err) != codes.Unavailable {
			t.Fatalf("err %v", err)
		}
	})
}
