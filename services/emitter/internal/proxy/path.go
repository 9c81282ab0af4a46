package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// Reasons a request is refused before it goes upstream (emitter_proxy_refused_total).
const (
	refusedDotSegment   = "dot_segment"
	refusedEncodedSlash = "encoded_slash"
	refusedProxyOff     = "proxy_off" // no upstream: EMITTER_UPSTREAM_URL=none and no route for the model
)

// maxRefusedModel is as much of a model a proxy-off answer quotes.
const maxRefusedModel = 200

var refusedReasons = []string{refusedDotSegment, refusedEncodedSlash, refusedProxyOff}

// pathProblem says why a request path cannot be forwarded: ServeMux routes on the path's
// segments, each decoded, while an upstream may decode the whole path before it splits it, or
// resolve dot segments that the client escaped (%2e%2e) so that ServeMux would not. A path
// whose segments are not the same both ways could leave the upstream's base path
// (EMITTER_UPSTREAM_URL=http://up/tenant-a, GET /v1/%2e%2e/%2e%2e/tenant-b/v1/models) or
// reach a measured endpoint unmeasured (POST /v1/chat%2Fcompletions). So a segment that
// decodes to "." or ".." (also before a ";", as servlet containers read "..;"), and a segment
// that decodes to one holding "/" or "\", are refused; any other path means the same to every
// upstream, and goes there as the client escaped it.
func pathProblem(escaped string) (reason, msg string) {
	for seg := range strings.SplitSeq(escaped, "/") {
		dec := seg
		if strings.IndexByte(seg, '%') >= 0 {
			var err error
			if dec, err = url.PathUnescape(seg); err != nil {
				// EscapedPath never returns one; refused all the same.
				return refusedEncodedSlash, "the request path is not validly percent-encoded"
			}
		}
		if strings.ContainsAny(dec, `/\`) {
			return refusedEncodedSlash, "the request path has an encoded slash (%2F) or a backslash in a segment"
		}
		name, _, _ := strings.Cut(dec, ";")
		if name == "." || name == ".." {
			return refusedDotSegment, "the request path has a dot segment (. or .., escaped or not)"
		}
	}
	return "", ""
}

// checkPath returns the path to forward, r's escaped path; or it refuses the request with 400
// in its protocol's error shape, counts it, and returns false.
func (p *Proxy) checkPath(w http.ResponseWriter, r *http.Request, proto meter.Protocol) (string, bool) {
	escaped := r.URL.EscapedPath()
	reason, msg := pathProblem(escaped)
	if reason == "" {
		return escaped, true
	}
	p.m.refused.WithLabelValues(reason).Inc()
	refuse(w, proto, http.StatusBadRequest, msg+": "+escaped)
	return "", false
}

// refuse answers status (4xx) in the protocol's shape of an invalid request.
func refuse(w http.ResponseWriter, proto meter.Protocol, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if proto == meter.Anthropic {
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":`+strconv.Quote(msg)+`}}`)
		return
	}
	_, _ = io.WriteString(w, `{"error":{"message":`+strconv.Quote(msg)+`,"type":"invalid_request_error","param":null,"code":null}}`)
}

// refuseOff answers 503 to a request no upstream takes: EMITTER_UPSTREAM_URL=none, and no
// EMITTER_UPSTREAMS route for model (empty: the request names none, and goes by its API).
// Nothing went upstream: no event is published.
func (p *Proxy) refuseOff(w http.ResponseWriter, r *http.Request, proto meter.Protocol, model string) {
	p.m.refused.WithLabelValues(refusedProxyOff).Inc()
	anthropic := anthropicRequest(r)
	if anthropic {
		proto = meter.Anthropic
	}
	msg := "the emitter's proxy is off (EMITTER_UPSTREAM_URL=none): it takes events on POST /v1/events, POST /v1/feedback and OTLP only"
	switch {
	case len(p.cfg.Routes) == 0:
	case model != "":
		if len(model) > maxRefusedModel {
			model = model[:maxRefusedModel] + "…"
		}
		q, _ := json.Marshal(model)
		msg = "no upstream for the model " + string(q) + ": EMITTER_UPSTREAM_URL=none, and no EMITTER_UPSTREAMS prefix matches it"
	case anthropic:
		msg = "no upstream for this request, which names no model: EMITTER_UPSTREAM_URL=none, and Anthropic's API goes to the EMITTER_UPSTREAMS route of claude-, which there is not"
	default:
		msg = "no upstream for this request, which names no model: EMITTER_UPSTREAM_URL=none, and OpenAI's API goes to the EMITTER_UPSTREAMS route of gpt-, which there is not"
	}
	body, _ := json.Marshal(msg) // the model is the client's: any bytes
	w.Header().Set("Content-Type", "application/json")
	// 503 says what it is, no upstream here; but the OpenAI and Anthropic SDKs retry every
	// 5xx (501 too) with backoff unless the server says otherwise, and asking again changes
	// nothing: the misconfigured app gets its error at once. A 404 would stop them too, read
	// as a missing model or path (NotFoundError), which it is not.
	w.Header().Set("X-Should-Retry", "false")
	w.WriteHeader(http.StatusServiceUnavailable)
	if proto == meter.Anthropic {
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":`+string(body)+`}}`)
		return
	}
	_, _ = io.WriteString(w, `{"error":{"message":`+string(body)+`,"type":"upstream_error","param":null,"code":"proxy_off"}}`)
}

// off reports whether no request can go upstream: EMITTER_UPSTREAM_URL=none and no routes.
func (p *Proxy) off() bool { return p.cfg.Upstream == nil && len(p.cfg.Routes) == 0 }
