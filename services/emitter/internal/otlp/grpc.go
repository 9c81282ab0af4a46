package otlp

import (
	"context"
	"fmt"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // OTLP exporters may compress with gzip
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// traceService is OTLP/gRPC's opentelemetry.proto.collector.trace.v1.TraceService.
type traceService struct {
	ptraceotlp.UnimplementedGRPCServer
	r *Receiver
}

// RegisterGRPC registers the receiver's TraceService on s. s must bound the messages it
// receives (grpc.MaxRecvMsgSize, which bounds them decompressed too).
func (r *Receiver) RegisterGRPC(s *grpc.Server) {
	ptraceotlp.RegisterGRPCServer(s, &traceService{r: r})
}

// Export takes one ExportTraceServiceRequest. The token, when set, comes as
// "authorization: Bearer <token>" metadata, as the exporters' headers option sends it.
func (t *traceService) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	r := t.r
	if r.opts.Token != "" {
		md, _ := metadata.FromIncomingContext(ctx)
		auth := md.Get("authorization")
		if len(auth) != 1 || !r.authorized(auth[0]) {
			return t.fail(codes.Unauthenticated, "missing or wrong bearer token")
		}
	}
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	case <-ctx.Done():
		return t.fail(codes.Unavailable, "canceled while waiting for a slot")
	}
	res := r.consume(req.Traces())
	if res.dropped > 0 {
		// Unavailable is retryable: the exporter sends the whole request again.
		return t.fail(codes.Unavailable, fmt.Sprintf("publish buffer full: %d spans not taken, send the request again", res.dropped))
	}
	resp := ptraceotlp.NewExportResponse()
	if res.rejected > 0 {
		resp.PartialSuccess().SetRejectedSpans(int64(res.rejected))
		resp.PartialSuccess().SetErrorMessage(res.message())
	}
	r.m.requests.WithLabelValues("grpc", codes.OK.String()).Inc()
	return resp, nil
}

func (t *traceService) fail(code codes.Code, msg string) (ptraceotlp.ExportResponse, error) {
	t.r.m.requests.WithLabelValues("grpc", code.String()).Inc()
	return ptraceotlp.NewExportResponse(), status.Error(code, msg)
}
