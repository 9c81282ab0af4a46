package otlp

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

const (
	contentProto = "application/x-protobuf"
	contentJSON  = "application/json"
)

// errBusy is the message of a request refused because the request bodies held take their
// memory budget; the client should send it again.
const errBusy = "the emitter is holding its limit of request bodies (EMITTER_MAX_PARSE_MEMORY): send the request again"

// ServeHTTP is OTLP/HTTP's POST /v1/traces: a binary protobuf or JSON
// ExportTraceServiceRequest, gzip-compressed or not. The answer is an
// ExportTraceServiceResponse in the request's encoding, with a partial success naming the
// rejected spans; a failure is a google.rpc.Status, as the OTLP specification says.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ct, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	isJSON := ct == contentJSON
	if !r.authorized(req.Header.Get("Authorization")) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tokenscope"`)
		r.fail(w, isJSON, http.StatusUnauthorized, codes.Unauthenticated, "missing or wrong bearer token")
		return
	}
	wait, err := emit.StoreWait(r.pub, req.Header.Get(emit.AckHeader))
	if err != nil {
		r.fail(w, isJSON, http.StatusBadRequest, codes.InvalidArgument, err.Error())
		return
	}
	if ct != contentProto && ct != contentJSON {
		r.fail(w, false, http.StatusUnsupportedMediaType, codes.InvalidArgument,
			fmt.Sprintf("content type %s is neither %s nor %s", strconv.Quote(cut(req.Header.Get("Content-Type"), 64)), contentProto, contentJSON))
		return
	}
	enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding")))
	if enc != "" && enc != "identity" && enc != "gzip" {
		r.fail(w, isJSON, http.StatusUnsupportedMediaType, codes.InvalidArgument,
			fmt.Sprintf("content encoding %s is not gzip", strconv.Quote(cut(enc, 64))))
		return
	}
	// The body is read before the request waits for its turn, as it arrives, so a client
	// sending slowly holds what it has sent and delays no other; the slots bound what
	// multiplies memory: decompressing and decoding. Nothing of the request outlives
	// consume (the events are encoded apart): its memory goes back when it is answered.
	var raw []byte
	var held, zheld int64
	slot := false
	free := func() { // the body's memory and the slot; once the events are published, or at return
		r.opts.Budget.Release(held + zheld)
		held, zheld = 0, 0
		if slot {
			<-r.slots
			slot = false
		}
	}
	defer free()
	raw, held, err = reqbody.ReadRequest(w, req, r.opts.MaxBytes, r.opts.Budget, r.opts.BodyIdle)
	// The waits for a slot, for room and for the acks are bounded together; they outlive an
	// exporter that half-closes its connection, whose request context net/http ends then: a
	// handler that returned without an answer would have net/http answer 200, a success
	// for spans never published.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(req.Context()), r.opts.StoreWait)
	defer cancel()
	if err == nil {
		select {
		case r.slots <- struct{}{}:
			slot = true
		case <-ctx.Done():
			w.Header().Set("Retry-After", "1")
			r.fail(w, isJSON, http.StatusServiceUnavailable, codes.Unavailable,
				fmt.Sprintf("no decode slot came free in %s (the emitter decodes two exports per processor at once): send the request again", r.opts.StoreWait))
			return
		}
	}
	body := raw
	if err == nil && enc == "gzip" {
		body, zheld, err = r.gunzip(raw)
	}
	switch {
	case errors.Is(err, reqbody.ErrTooLarge):
		r.fail(w, isJSON, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
			fmt.Sprintf("body is over the %d byte limit", r.opts.MaxBytes))
		return
	case errors.Is(err, reqbody.ErrBudgetFull):
		r.m.refusedHTTP.Inc()
		w.Header().Set("Retry-After", "1")
		r.fail(w, isJSON, http.StatusServiceUnavailable, codes.Unavailable, errBusy)
		return
	case errors.Is(err, reqbody.ErrStalled):
		w.Header().Set("Connection", "close")
		r.fail(w, isJSON, http.StatusRequestTimeout, codes.DeadlineExceeded, "cannot read the body: "+err.Error())
		return
	case err != nil:
		r.fail(w, isJSON, http.StatusBadRequest, codes.InvalidArgument, "cannot read the body: "+err.Error())
		return
	}
	estimate := protoDecodedSize
	if isJSON {
		estimate = jsonDecodedSize
	}
	if size := estimate(body); size > r.maxDecoded() {
		r.fail(w, isJSON, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
			fmt.Sprintf("%v: about %d bytes, over %d (%d times the largest request): send fewer spans per request",
				errTooManyElements, size, r.maxDecoded(), decodedFactor))
		return
	}
	er := ptraceotlp.NewExportRequest()
	if isJSON {
		err = er.UnmarshalJSON(body)
	} else {
		err = er.UnmarshalProto(body)
	}
	if err != nil {
		r.fail(w, isJSON, http.StatusBadRequest, codes.InvalidArgument, "cannot decode the ExportTraceServiceRequest: "+cut(err.Error(), 256))
		return
	}
	res := r.consume(ctx, er.Traces(), wait)
	free()
	res.waitStored(ctx, wait)
	if res.storeErr != nil {
		msg, retry := res.storeFailure()
		if !retry {
			r.fail(w, isJSON, http.StatusInternalServerError, codes.Internal, msg)
			return
		}
		w.Header().Set("Retry-After", "1")
		r.fail(w, isJSON, http.StatusServiceUnavailable, codes.Unavailable, msg)
		return
	}
	if res.dropped > 0 {
		// OTLP exporters send the whole request again after a 503.
		w.Header().Set("Retry-After", "1")
		r.fail(w, isJSON, http.StatusServiceUnavailable, codes.Unavailable,
			fmt.Sprintf("publish buffer full: %d spans not taken, send the request again", res.dropped))
		return
	}
	resp := ptraceotlp.NewExportResponse()
	if res.rejected > 0 {
		resp.PartialSuccess().SetRejectedSpans(int64(res.rejected))
		resp.PartialSuccess().SetErrorMessage(res.message())
	}
	var out []byte
	if isJSON {
		out, err = resp.MarshalJSON()
	} else {
		out, err = resp.MarshalProto()
	}
	if err != nil { // cannot happen for a message this package built
		r.fail(w, isJSON, http.StatusInternalServerError, codes.Internal, "cannot encode the answer")
		return
	}
	r.write(w, isJSON, http.StatusOK, out)
}

// gunzip decompresses a gzip body, up to MaxBytes, in memory from the budget; held is what
// the caller releases.
func (r *Receiver) gunzip(raw []byte) (body []byte, held int64, err error) {
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, 0, fmt.Errorf("cannot read gzip: %w", err)
	}
	defer zr.Close()
	return reqbody.Read(zr, -1, r.opts.MaxBytes, r.opts.Budget)
}

// fail answers with a google.rpc.Status, the body of every OTLP/HTTP failure.
func (r *Receiver) fail(w http.ResponseWriter, isJSON bool, status int, code codes.Code, msg string) {
	st := &spb.Status{Code: int32(code), Message: msg}
	var out []byte
	if isJSON {
		out, _ = protojson.Marshal(st)
	} else {
		out, _ = proto.Marshal(st)
	}
	r.write(w, isJSON, status, out)
}

func (r *Receiver) write(w http.ResponseWriter, isJSON bool, status int, body []byte) {
	r.m.requests.WithLabelValues("http", strconv.Itoa(status)).Inc()
	if isJSON {
		w.Header().Set("Content-Type", contentJSON)
	} else {
		w.Header().Set("Content-Type", contentProto)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// cut bounds a client's value quoted in a message.
func cut(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
