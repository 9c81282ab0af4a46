package otlp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // OTLP exporters may compress with gzip
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// traceService is OTLP/gRPC's opentelemetry.proto.collector.trace.v1.TraceService.
type traceService struct {
	ptraceotlp.UnimplementedGRPCServer
	r *Receiver
}

// RegisterGRPC registers the receiver's TraceService on s. s must bound the messages it
// receives (grpc.MaxRecvMsgSize, which bounds them decompressed too) and their decoded
// size (GRPCCodec).
func (r *Receiver) RegisterGRPC(s *grpc.Server) {
	ptraceotlp.RegisterGRPCServer(s, &traceService{r: r})
}

// GRPCCodec is the server option that makes s check a request's decoded size before
// decoding it: one over decodedFactor times MaxBytes is refused (Internal, as for any
// message the server cannot decode; an exporter does not send it again).
func (r *Receiver) GRPCCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(newCodec(r.maxDecoded()))
}

// tap runs before grpc-go reads an RPC's message (a grpc.InTapHandle). It refuses an RPC
// without the token, so that a client without it cannot make the server read, decompress
// and hold a message of up to EMITTER_OTLP_MAX_BYTES; and it takes that much from the
// budget until the stream ends, refusing the RPC at once when there is no room: grpc-go
// reads and decompresses the message before the handler could wait for memory. grpc-go
// cancels the stream's context however the stream ends (answered, reset, its connection
// gone), and the context the tap returns is the stream's.
func (r *Receiver) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if r.opts.Token != "" {
		if auth := info.Header.Get("authorization"); len(auth) != 1 || !r.authorized(auth[0]) {
			r.m.requests.WithLabelValues("grpc", codes.Unauthenticated.String()).Inc()
			return ctx, status.Error(codes.Unauthenticated, "missing or wrong bearer token")
		}
	}
	// Twice the largest message: grpc-go holds a compressed one beside its decompressed
	// form, and whether the call is compressed is not known yet (grpc-encoding is not in
	// info.Header).
	n := 2 * r.maxRecv()
	if !r.opts.Budget.Reserve(n) {
		r.m.refusedGRPC.Inc()
		r.m.requests.WithLabelValues("grpc", codes.Unavailable.String()).Inc()
		return ctx, status.Error(codes.Unavailable, errBusy)
	}
	// grpc-go waits for the message for as long as the client keeps the call open,
	// holding that much all the while: a call whose message has not come in the idle
	// timeout is canceled (the exporter sends it again). Export stops the clock.
	ctx, cancel := context.WithCancel(ctx)
	h := &callHold{wait: time.AfterFunc(r.bodyIdle(), func() {
		r.m.requests.WithLabelValues("grpc", codes.DeadlineExceeded.String()).Inc()
		cancel()
	})}
	h.release = func() { h.once.Do(func() { r.opts.Budget.Release(n) }) }
	context.AfterFunc(ctx, func() {
		h.wait.Stop()
		h.release()
	})
	return context.WithValue(ctx, holdKey{}, h), nil
}

// callHold is what the tap holds for a call, found in its context under holdKey: the timer
// that cancels a call whose message has not come, and the release of the call's budget,
// which Export calls once the events are published, before waiting for them to be stored.
type callHold struct {
	wait    *time.Timer
	once    sync.Once
	release func()
}

type holdKey struct{}

func (r *Receiver) bodyIdle() time.Duration {
	if r.opts.BodyIdle > 0 {
		return r.opts.BodyIdle
	}
	return reqbody.IdleTimeout
}

// maxRecv is the largest message grpc-go reads, compressed or once decompressed.
func (r *Receiver) maxRecv() int64 { return min(r.opts.MaxBytes, 1<<31-1) }

// maxDecoded is the most memory a request may take once decoded (estimated before it is).
func (r *Receiver) maxDecoded() int64 { return decodedFactor * r.opts.MaxBytes }

// Export takes one ExportTraceServiceRequest. The token, when set, comes as
// "authorization: Bearer <token>" metadata, as the exporters' headers option sends it.
func (t *traceService) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	r := t.r
	hold, _ := ctx.Value(holdKey{}).(*callHold)
	if hold != nil && !hold.wait.Stop() {
		// Counted when the clock ran out.
		return ptraceotlp.NewExportResponse(), status.Error(codes.DeadlineExceeded, "the message came after the call was given up")
	}
	if r.opts.Token != "" {
		md, _ := metadata.FromIncomingContext(ctx)
		auth := md.Get("authorization")
		if len(auth) != 1 || !r.authorized(auth[0]) {
			return t.fail(codes.Unauthenticated, "missing or wrong bearer token")
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	var ack string
	if v := md.Get(strings.ToLower(emit.AckHeader)); len(v) > 0 {
		ack = v[0]
	}
	wait, err := emit.StoreWait(r.pub, ack)
	if err != nil {
		return t.fail(codes.InvalidArgument, err.Error())
	}
	select {
	case r.slots <- struct{}{}:
	case <-ctx.Done():
		return t.fail(codes.Unavailable, "canceled while waiting for a slot")
	}
	wctx, cancel := context.WithTimeout(ctx, r.opts.StoreWait)
	defer cancel()
	res := r.consume(wctx, req.Traces(), wait)
	// The events are encoded apart: the message's memory and the slot go back before the
	// wait for JetStream.
	<-r.slots
	if hold != nil {
		hold.release()
	}
	res.waitStored(wctx, wait)
	if res.storeErr != nil {
		msg, retry := res.storeFailure()
		if !retry {
			return t.fail(codes.Internal, msg)
		}
		return t.fail(codes.Unavailable, msg)
	}
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
