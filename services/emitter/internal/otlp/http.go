package otlp

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"

	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

const (
	contentProto = "application/x-protobuf"
	contentJSON  = "application/json"
)

// errTooLarge is a body over MaxBytes, compressed or once decompressed.
var errTooLarge = errors.New("request too large")

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
	if req.ContentLength > r.opts.MaxBytes {
		r.fail(w, isJSON, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
			fmt.Sprintf("body of %d bytes is over the %d byte limit", req.ContentLength, r.opts.MaxBytes))
		return
	}
	// The body is read before the request waits for its turn, as it arrives, so a client
	// sending slowly holds what it has sent and delays no other; the slots bound what
	// multiplies memory: decompressing and decoding.
	raw, err := r.readBody(w, req)
	if raw != nil {
		// Nothing of the request outlives consume: the events are encoded apart.
		defer putBody(raw)
	}
	if err == nil {
		select {
		case r.slots <- struct{}{}:
			defer func() { <-r.slots }()
		case <-req.Context().Done():
			return
		}
	}
	body := raw
	if err == nil && enc == "gzip" {
		body, err = r.gunzip(raw)
	}
	if err != nil {
		if errors.Is(err, errTooLarge) {
			r.fail(w, isJSON, http.StatusRequestEntityTooLarge, codes.InvalidArgument,
				fmt.Sprintf("body is over the %d byte limit", r.opts.MaxBytes))
			return
		}
		r.fail(w, isJSON, http.StatusBadRequest, codes.InvalidArgument, "cannot read the body: "+err.Error())
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
	res := r.consume(er.Traces())
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

// bodies holds the buffers of bodies of known length, up to maxPooled bytes, for reuse.
var bodies sync.Pool

const maxPooled = 4 << 20

func putBody(b []byte) {
	if cap(b) <= maxPooled {
		bodies.Put(&b)
	}
}

// readBody reads the body as sent, still compressed when it is, up to MaxBytes. The buffer
// of a body of declared length comes from the pool when one there is large enough, and
// otherwise grows with what arrives, from one chunk up to the declared length, never to it
// at once; it may go back to the pool with putBody.
func (r *Receiver) readBody(w http.ResponseWriter, req *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, req.Body, r.opts.MaxBytes)
	n := req.ContentLength // the server reads no further than it
	if n <= 0 {
		return r.readAll(body)
	}
	var buf []byte
	if p, ok := bodies.Get().(*[]byte); ok && int64(cap(*p)) >= n {
		buf = (*p)[:0]
	} else {
		buf = make([]byte, 0, min(n, readChunk))
	}
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(n, 2*int64(cap(buf))))-len(buf))
		}
		m, err := body.Read(buf[len(buf):min(int64(cap(buf)), n)])
		buf = buf[:len(buf)+m]
		if err == io.EOF && int64(len(buf)) < n {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			putBody(buf)
			return nil, tooLarge(err)
		}
	}
	return buf, nil
}

// readChunk is the buffer a body of declared length starts in when the pool has none
// large enough; it doubles as the body arrives.
const readChunk = 64 << 10

// gunzip decompresses a gzip body, up to MaxBytes.
func (r *Receiver) gunzip(raw []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("cannot read gzip: %w", err)
	}
	defer zr.Close()
	return r.readAll(zr)
}

// readAll reads body up to MaxBytes.
func (r *Receiver) readAll(body io.Reader) ([]byte, error) {
	limit := r.opts.MaxBytes
	// One byte more than the limit tells a body at the limit from one over it.
	buf, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, tooLarge(err)
	}
	if int64(len(buf)) > limit {
		return nil, errTooLarge
	}
	return buf, nil
}

func tooLarge(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errTooLarge
	}
	return err
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
