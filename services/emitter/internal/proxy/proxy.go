package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// Label headers: the app names the scene, env, tenant and conversation of a request; they
// are not forwarded upstream.
const (
	HeaderScene        = "X-Tokenscope-Scene"
	HeaderEnv          = "X-Tokenscope-Env"
	HeaderTenant       = "X-Tokenscope-Tenant"
	HeaderConversation = "X-Tokenscope-Conversation-Id"
	HeaderTurn         = "X-Tokenscope-Turn"
	labelHeaderPrefix  = "X-Tokenscope-"
)

// Error codes of the events the proxy makes when the upstream fails outside the body.
const (
	CodeUpstreamTimeout     = "upstream_timeout"
	CodeStreamIdle          = "stream_idle"
	CodeUpstreamUnreachable = "upstream_unreachable"
	CodeUpstreamDisconnect  = "upstream_disconnect"
	CodeClientGone          = "client_disconnect"
	unknownModel            = "unknown"
)

var (
	errUpstreamTimeout = errors.New("upstream did not answer in time")
	errStreamIdle      = errors.New("upstream stream stalled")
)

// Emitter publishes a finished request's event without blocking.
type Emitter interface {
	Emit(ev *events.RequestEvent, now time.Time) error
}

// Proxy is the gateway's HTTP handler.
type Proxy struct {
	cfg       Config
	transport http.RoundTripper
	h1        *h1
	dialable  map[*url.URL]bool // the upstreams h1 serves
	emit      Emitter
	logger    *slog.Logger
	m         *metrics
	bufs      sync.Pool
	meters    sync.Pool
	gzips     sync.Pool
	refused   prometheus.Counter // bodies the budget had no room for

	// Set by Listener, before serving: streams are detached from net/http (detach.go).
	detachAfter  time.Duration
	parkAfter    time.Duration
	ln           *listener
	watch        *watcher
	open         streamSet
	flights      flightSet // every measured request until its event is out, for Drain
	watchFailing atomic.Bool
	loops        *loops // relay the streams they can (loop_linux.go); nil: none
}

// New returns a proxy sending to the upstreams of cfg and emitting through emit.
func New(cfg Config, emit Emitter, reg prometheus.Registerer, logger *slog.Logger) *Proxy {
	if cfg.MaxLabels <= 0 {
		cfg.MaxLabels = 100
	}
	if cfg.MaxParseBytes <= 0 {
		cfg.MaxParseBytes = 32 << 20
	}
	if cfg.Budget == nil {
		cfg.Budget = reqbody.NewBudget(reqbody.DefaultLimit, nil)
	}
	if cfg.MaxEventBytes <= 0 {
		cfg.MaxEventBytes = meter.DefaultMaxEvent
	}
	if cfg.ClientIdleTimeout <= 0 {
		cfg.ClientIdleTimeout = DefaultClientIdleTimeout
	}
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		// The client gets the upstream's bytes as they are: never ask for or undo gzip on its behalf.
		DisableCompression: true,
		// Small buffers: thousands of streams stay open at once, each mostly idle.
		WriteBufferSize: 1 << 10,
		ReadBufferSize:  1 << 10,
	}
	p := &Proxy{cfg: cfg, transport: t, h1: newH1(1024, 90*time.Second), dialable: map[*url.URL]bool{},
		emit: emit, logger: logger.With("component", "proxy"), m: newMetrics(reg, cfg.MaxLabels),
		refused: cfg.Budget.Refusals("proxy"), detachAfter: detachAfter, parkAfter: parkAfter}
	for _, u := range append([]*url.URL{cfg.Upstream}, routeURLs(cfg.Routes)...) {
		if u != nil {
			p.dialable[u] = canDial(u)
		}
	}
	p.bufs.New = func() any { b := make([]byte, 2<<10); return &b }
	p.meters.New = func() any { return &meter.Meter{} }
	return p
}

// Register adds the proxy's routes: the four measured APIs, and every other /v1/ path
// forwarded unmeasured so that SDKs and Claude Code keep working.
// A measured path with a trailing slash is measured too: some upstreams serve it as the path
// without. Paths that an upstream could split or resolve otherwise are refused (path.go).
func (p *Proxy) Register(mux interface{ Handle(string, http.Handler) }) {
	for path, proto := range map[string]meter.Protocol{"/v1/chat/completions": meter.OpenAIChat,
		"/v1/completions": meter.OpenAICompletions, "/v1/messages": meter.Anthropic, "/v1/responses": meter.OpenAIResponses} {
		mux.Handle("POST "+path, p.handler(proto))
		mux.Handle("POST "+path+"/{$}", p.handler(proto))
	}
	mux.Handle("/v1/", http.HandlerFunc(p.passthrough))
}

// Listener wraps the listener of the HTTP server the proxy serves on, before it serves.
// Through it the proxy detaches streams from net/http, so that an open stream costs the
// proxy's own state only, and gives their connections back for the clients' next requests
// (detach.go). Without it, or where connections cannot be watched (not Linux), streams stay
// with net/http. Call Drain after the server's Shutdown.
//
// Every connection it accepts is followed request by request (framing.go): one whose
// framing is ambiguous is closed after its answer.
func (p *Proxy) Listener(ln net.Listener) net.Listener {
	ln = framingListener{Listener: ln, problems: p.m.framing}
	w, err := newWatcher()
	if err != nil {
		p.logger.Info("streams stay with net/http", "err", err)
		return ln
	}
	p.watch, p.ln = w, newListener(ln, w, p.cfg.ClientIdleTimeout)
	if ls, err := newLoops(p.cfg.Loops, p.logger); err != nil {
		p.logger.Info("streams are relayed on goroutines", "err", err)
	} else {
		p.loops = ls
		p.h1.loops = ls
	}
	return p.ln
}

// connKey is the request context's key to the client's connection (ConnContext).
type connKey struct{}

// ConnContext is the HTTP server's http.Server.ConnContext: it tells a handler the client's
// connection, whose socket the relay loop writes a stream to.
func (p *Proxy) ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// Close releases the upstream connections and the watcher; call it once the server and
// Drain have returned.
func (p *Proxy) Close() {
	if t, ok := p.transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	p.h1.closeIdle(true)
	if p.watch != nil {
		_ = p.watch.Close()
	}
	if p.loops != nil {
		p.loops.close()
	}
}

func routeURLs(routes []Route) []*url.URL {
	out := make([]*url.URL, len(routes))
	for i, r := range routes {
		out[i] = r.URL
	}
	return out
}

func (p *Proxy) handler(proto meter.Protocol) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, proto) })
}

// readBody reads the body up to the parse limit, in memory reserved from the budget that all
// bodies share until their upstream answers (release). Past the limit, or when the budget
// has no room for the body, the body is forwarded as a stream and not parsed. held is what
// the caller must release, even for a body forwarded unparsed. A body of which nothing
// arrives for the idle timeout is given up (reqbody.ErrStalled): it would hold its
// connection and its memory for as long as the client kept it open.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) (head []byte, rest io.Reader, held int64, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil, 0, nil
	}
	buf, held, err := reqbody.ReadRequest(w, r, p.cfg.MaxParseBytes, p.cfg.Budget, p.cfg.BodyIdle)
	switch {
	case err == nil:
		return buf, nil, held, nil
	case errors.Is(err, reqbody.ErrTooLarge):
		p.m.unparsed.WithLabelValues(unparsedTooLarge).Inc()
	case errors.Is(err, reqbody.ErrBudgetFull):
		p.m.unparsed.WithLabelValues(unparsedMemory).Inc()
		p.refused.Inc()
	default:
		p.cfg.Budget.Release(held)
		return nil, nil, 0, err
	}
	// The rest goes upstream as it comes, for as long as the upstream takes it.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	rest = r.Body
	if len(buf) > 0 {
		rest = io.MultiReader(bytes.NewReader(buf), r.Body)
	}
	return nil, rest, held, nil
}

// exchange is one request on its way through.
type exchange struct {
	start  time.Time
	proto  meter.Protocol
	path   string // escaped, as checked
	stream bool
	strip  bool
	model  string
	named  bool // model is the body's, not unknownModel
	body   []byte
	rest   io.Reader
	unread bool  // the body goes upstream unparsed, from rest
	held   int64 // of the request bodies' budget, until the upstream answers
	input  int64 // estimate from the body's size, used when no usage comes back
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, proto meter.Protocol) {
	if p.off() {
		p.refuseOff(w, r, proto, "")
		return
	}
	path, ok := p.checkPath(w, r, proto)
	if !ok {
		return
	}
	x := exchange{start: time.Now(), proto: proto, model: unknownModel, path: path}
	p.m.inflight.Inc() // until the flight closes
	head, rest, held, err := p.readBody(w, r)
	if err != nil {
		// The client's body broke off or stalled: nothing went upstream, nothing to measure.
		p.m.inflight.Dec()
		badBody(w, proto, err)
		return
	}
	x.body, x.rest, x.unread, x.held = head, rest, rest != nil, held
	if head != nil && isIdentity(r.Header.Get("Content-Encoding")) {
		if info, ok := readRequest(head); ok {
			if info.Model != "" {
				x.model, x.named = info.Model, true
			}
			x.stream = info.Stream
			if info.Stream && (proto == meter.OpenAIChat || proto == meter.OpenAICompletions) {
				x.body, x.strip = withUsage(head, info.StreamOptions)
			}
		}
	}
	x.input = inputEstimate(head, r.ContentLength)
	p.forward(w, r, &x)
}

// inputEstimate is the input tokens of a request whose answer reports no usage: its bytes
// / 4, those of a body forwarded unread or compressed too (declared bytes; -1: unknown),
// within what an event can carry.
func inputEstimate(head []byte, declared int64) int64 {
	n := declared
	if head != nil {
		n = int64(len(head))
	}
	if n <= 0 {
		return 0
	}
	return min(n/4+min(n%4, 1), events.MaxTokens)
}

func isIdentity(enc string) bool { return enc == "" || strings.EqualFold(enc, "identity") }

// passthrough forwards any other /v1/ request unmeasured: to the upstream the model in its
// body routes to (Anthropic's /v1/messages/count_tokens names one), so that the client's key
// for that provider goes where its measured requests go; by its API when it names none
// (Config.route).
func (p *Proxy) passthrough(w http.ResponseWriter, r *http.Request) {
	if p.off() {
		p.refuseOff(w, r, meter.OpenAIChat, "")
		return
	}
	path, ok := p.checkPath(w, r, meter.OpenAIChat)
	if !ok {
		return
	}
	start := time.Now()
	base, body, length := p.cfg.Upstream, io.Reader(r.Body), int64(-1)
	held, streamed, model := int64(0), true, ""
	if len(p.cfg.Routes) > 0 {
		head, rest, h, err := p.readBody(w, r)
		if err != nil {
			badBody(w, meter.OpenAIChat, err)
			return
		}
		held = h
		switch {
		case head != nil:
			if info, ok := readRequest(head); ok && isIdentity(r.Header.Get("Content-Encoding")) {
				model = info.Model
			}
			body, length, streamed = bytes.NewReader(head), int64(len(head)), false
		case rest != nil:
			body = rest
		default:
			streamed = false // no body
		}
		base = p.cfg.route(model, anthropicRequest(r))
	}
	if base == nil {
		p.cfg.Budget.Release(held)
		p.refuseOff(w, r, meter.OpenAIChat, model)
		return
	}
	p.m.passthrough.Inc()
	if streamed {
		fullDuplex(w)
	}
	out, cancel := p.outgoing(r.Context(), r, base, path, body, length)
	defer cancel(nil)
	// The response headers are waited for as long as a measured request's.
	late := func() bool { return false }
	if d := p.cfg.UpstreamTimeout; d > 0 {
		var fired atomic.Bool
		t := time.AfterFunc(d, func() { fired.Store(true); cancel(errUpstreamTimeout) })
		late = func() bool { t.Stop(); return fired.Load() }
	}
	resp, err := p.transport.RoundTrip(out)
	timedOut := late()
	p.cfg.Budget.Release(held) // the upstream has the body
	if err == nil && timedOut {
		resp.Body.Close() // the timeout won: the late response is dropped
		err = errUpstreamTimeout
	}
	switch {
	case err != nil && timedOut:
		writeError(w, meter.OpenAIChat, http.StatusGatewayTimeout, "the upstream did not answer in time")
		return
	case err != nil:
		writeError(w, meter.OpenAIChat, http.StatusBadGateway, "cannot reach the upstream")
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	bp := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(bp)
	client := &response{w: w, rc: http.NewResponseController(w)}
	// A body silent for the idle timeout is cut, as a measured one is; the time the client
	// takes to read a piece does not count. Until its first byte it may be silent, as a
	// measured answer until its first token, up to the upstream timeout since the request
	// began (a GET of a background response's stream while the model still reasons).
	idle := func(bool) {}
	if d := p.cfg.IdleTimeout; d > 0 {
		t := time.AfterFunc(max(d, p.cfg.UpstreamTimeout-time.Since(start)), func() { cancel(errStreamIdle) })
		defer t.Stop()
		idle = func(on bool) {
			if on {
				t.Reset(d)
			} else {
				t.Stop()
			}
		}
	}
	for {
		n, err := resp.Body.Read(*bp)
		if n > 0 {
			idle(false)
			if client.send((*bp)[:n]) != nil {
				return
			}
			idle(true)
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			// The upstream broke off, or fell silent: break the client's connection too.
			// Returning would end a chunked answer cleanly, and the client would take what
			// came for the whole of it (a file, a batch's output, a stream), where a direct
			// call fails.
			client.abort()
			return
		}
	}
}

// badBody answers a request whose body could not be read: 408 when it stalled, 400 when it
// broke off.
func badBody(w http.ResponseWriter, proto meter.Protocol, err error) {
	if errors.Is(err, reqbody.ErrStalled) {
		w.Header().Set("Connection", "close")
		refuse(w, proto, http.StatusRequestTimeout, "the request body stalled: "+err.Error())
		return
	}
	http.Error(w, "cannot read the request body", http.StatusBadRequest)
}

// fullDuplex lets the request's body go on being read, upstream, once the answer's head is
// written: an HTTP/1 handler's unread body is otherwise consumed by net/http at the first
// write, and http.Transport, still reading it (its check for the body's end, if nothing
// else), then closes the upstream connection, the answer cut short with it.
func fullDuplex(w http.ResponseWriter) {
	_ = http.NewResponseController(w).EnableFullDuplex() // HTTP/2: always
}

// outgoing builds the upstream request to base's path followed by path, r's escaped path as
// checked. Its context ends with parent, or with the cause given to the returned cancel.
func (p *Proxy) outgoing(parent context.Context, r *http.Request, base *url.URL, path string, body io.Reader, length int64) (*http.Request, context.CancelCauseFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	u := *base
	u.Path = base.Path + r.URL.Path
	u.RawPath = base.EscapedPath() + path // the bytes checked, not a new encoding of Path
	// The upstream URL's own query (Azure's api-version) comes first, then the client's.
	switch {
	case base.RawQuery == "":
		u.RawQuery = r.URL.RawQuery
	case r.URL.RawQuery != "":
		u.RawQuery = base.RawQuery + "&" + r.URL.RawQuery
	}
	out := (&http.Request{Method: r.Method, URL: &u, Host: u.Host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header, len(r.Header)), Body: io.NopCloser(body), ContentLength: length}).WithContext(ctx)
	if body == nil || body == http.NoBody {
		out.Body, out.ContentLength = http.NoBody, 0
	} else if length < 0 {
		out.ContentLength = r.ContentLength
	}
	copyHeader(out.Header, r.Header)
	for k := range out.Header {
		if strings.HasPrefix(k, labelHeaderPrefix) {
			delete(out.Header, k)
		}
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		out.Header["User-Agent"] = nil // Go must not add its own
	}
	return out, cancel
}

// hopHeaders are meant for one connection only (RFC 9110, 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		dst[k] = v
	}
	for _, f := range src["Connection"] {
		for _, name := range strings.Split(f, ",") {
			dst.Del(strings.TrimSpace(name))
		}
	}
	for _, h := range hopHeaders {
		delete(dst, h)
	}
}

// writeError answers the client in its protocol's error shape when the upstream could not.
func writeError(w http.ResponseWriter, proto meter.Protocol, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if proto == meter.Anthropic {
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":`+strconv.Quote(msg)+`}}`)
		return
	}
	_, _ = io.WriteString(w, `{"error":{"message":`+strconv.Quote(msg)+`,"type":"upstream_error","param":null,"code":null}}`)
}

// A flight is one measured request from when it goes upstream until its event is out. A stream
// detached from net/http outlives the handler, and its flight with it.
type flight struct {
	p      *Proxy
	ev     events.RequestEvent
	dog    watchdog
	ctx    context.Context // the upstream request's
	cancel context.CancelCauseFunc
	start  time.Time
	proto  meter.Protocol
	stream bool // the client asked for a stream
	input  int64

	// Once the response headers are in:
	status int
	body   io.ReadCloser
	m      *meter.Meter
	enc    encoding
	sse    bool // the answer is a stream
	strip  bool // of the usage chunk the proxy asked for
	rl     relay

	// A stream that may be detached (detach.go), until it is: the response to hijack, whether
	// the connection may serve another request, and the end of the client's watch by net/http.
	w      http.ResponseWriter
	keep   bool
	unhook func() bool
	d      *detached   // once detached
	ls     *loopStream // when relayed on the loop; set under pk

	pk   sync.Mutex
	park parking

	// net/http's writer to the client while the handler relays; guarded by p.flights.mu, for
	// Drain to unblock a write to a client that stopped reading.
	rc *http.ResponseController
}

func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, x *exchange) {
	model := x.model
	if !x.named {
		model = ""
	}
	base := p.cfg.route(model, anthropicRequest(r))
	if base == nil {
		p.m.inflight.Dec()
		p.cfg.Budget.Release(x.held)
		p.refuseOff(w, r, x.proto, model)
		return
	}
	c := &flight{p: p, start: x.start, proto: x.proto, stream: x.stream, input: x.input}
	c.ev = events.RequestEvent{V: events.Version, EventID: events.NewEventID(), TS: x.start.UTC(),
		Model: x.model, Provider: x.proto.Provider(), Instance: base.Host, Stream: x.stream}
	p.labels(&c.ev, r.Header)

	// A body in memory to a plain-HTTP upstream goes through the proxy's own client.
	direct := !x.unread && p.dialable[base]
	var body io.Reader = x.rest
	length := int64(-1)
	if x.body != nil && !direct {
		body, length = bytes.NewReader(x.body), int64(len(x.body))
	}
	if x.unread {
		fullDuplex(w)
	}
	// The upstream request's context is the proxy's, not the handler's, so that a detached
	// stream outlives the handler; until then the client's connection is net/http's, and
	// its end ends the upstream request.
	out, cancel := p.outgoing(context.Background(), r, base, x.path, body, length)
	c.ev.TraceID = trace(out.Header)
	c.ctx, c.cancel = out.Context(), cancel
	p.flights.add(c)
	unhook := context.AfterFunc(r.Context(), func() { cancel(errClientGone) })
	if x.strip {
		// The proxy must edit this stream: the upstream may only encode it in a way the
		// proxy can decode.
		decodableEncodings(out.Header)
	}
	if direct && p.canDetach(r, x) {
		c.dog.park, c.dog.parkAfter = c.askPark, p.parkAfter
		c.park.undecided = true // no watchdog yet: no lock needed
	}
	c.dog.arm(x.start, p.cfg.UpstreamTimeout, p.cfg.IdleTimeout, cancel)

	var resp *http.Response
	var err error
	if direct {
		resp, err = p.h1.roundTrip(out, x.body)
	} else {
		resp, err = p.transport.RoundTrip(out)
	}
	// The upstream has the body: an open stream need not keep it.
	x.body, x.rest = nil, nil
	p.cfg.Budget.Release(x.held)
	x.held = 0
	if err == nil && !c.dog.answer(time.Now()) {
		// The timeout fired as the headers arrived: it wins, the late response is dropped.
		resp.Body.Close()
		err = errUpstreamTimeout
	}
	if err != nil {
		end := time.Now()
		c.ev.TotalMs = msSince(x.start, end)
		late := c.dog.expired()
		switch {
		case errors.Is(context.Cause(c.ctx), errShutdown):
			c.ev.Status, c.ev.ErrorCode = events.StatusError, CodeShutdown
			writeError(w, x.proto, http.StatusServiceUnavailable, "the gateway is shutting down")
		case r.Context().Err() != nil:
			c.ev.Status, c.ev.ErrorCode = events.StatusCanceled, CodeClientGone
		case late:
			c.ev.Status, c.ev.ErrorCode = events.StatusTimeout, CodeUpstreamTimeout
			writeError(w, x.proto, http.StatusGatewayTimeout, "the upstream did not answer in time")
		default:
			c.ev.Status, c.ev.ErrorCode = events.StatusError, CodeUpstreamUnreachable
			writeError(w, x.proto, http.StatusBadGateway, "cannot reach the upstream")
		}
		c.ev.InputTokens, c.ev.TokensEstimated = x.input, true
		unhook()
		c.close()
		p.finish(&c.ev, end)
		p.flights.remove(c)
		return
	}

	c.status, c.body = resp.StatusCode, resp.Body
	ok := resp.StatusCode < 300
	// An answer is measured as what it is: an event stream is one, for a request whose body
	// was not read (too large, compressed) too, and for one whose stream member is no JSON
	// true, which an upstream may take for it all the same (pydantic's lax bool: 1, "true").
	c.sse = ok && meter.IsEventStream(resp.Header.Get("Content-Type"))
	if c.sse {
		c.ev.Stream = true
	}
	c.ev.HTTPStatus = resp.StatusCode
	if resp.StatusCode == http.StatusTooManyRequests {
		if s, ok := retryAfter(resp.Header, time.Now()); ok {
			p.m.retryAfter.WithLabelValues(c.ev.Provider).Observe(s)
		}
	}
	c.m = p.meters.Get().(*meter.Meter)
	c.m.Reset(x.proto, c.sse, x.start)
	c.m.SetMaxEvent(p.cfg.MaxEventBytes)
	c.m.SetInputEstimate(x.input)
	c.enc = contentEncoding(resp.Header)
	// The usage chunk the proxy asked for is stripped from an identity stream, and from a
	// gzip one by decoding it for the client.
	c.strip = x.strip && c.sse && c.enc != other
	if c.strip {
		c.m.StripUsageChunk()
	}
	h := w.Header()
	copyHeader(h, resp.Header)
	resp.Header = nil // copied: an open stream need not keep the map (net/http's body points to resp)
	if c.strip {
		h.Del("Content-Length")
		if c.enc == gzipped {
			h.Del("Content-Encoding")
		}
	}
	if c.sse {
		p.m.streams.Inc() // until the event goes out
	}
	_, framed := h["Content-Length"]
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	p.flights.writing(c, rc)
	defer p.flights.writing(c, nil) // the handler returns: rc is no longer the flight's to use
	_ = rc.Flush()
	if c.sse && !framed && c.enc == identity && p.canDetach(r, x) {
		// net/http sent the head chunked: the stream may leave it later.
		c.w, c.keep, c.unhook = w, !r.Close, unhook
		if onLoop, handedOff := c.onLoop(r, &response{w: w, rc: rc}); onLoop {
			if !handedOff {
				unhook()
			}
			return
		}
		c.mayPark()
	}
	c.decided()
	if !c.relay(&response{w: w, rc: rc}) {
		unhook()
	}
}

// close ends the upstream request and its watchdog.
func (c *flight) close() {
	c.dog.stop()
	c.cancel(nil)
	c.p.m.inflight.Dec()
}

// client is the client's side of an answer: net/http's response, or a detached connection.
type client interface {
	send(p []byte) error // writes p and flushes it
	abort()              // breaks the connection, so the client sees the answer cut short
}

// response is the client as net/http serves it.
type response struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (r *response) send(p []byte) error {
	if _, err := r.w.Write(p); err != nil {
		return err
	}
	return r.rc.Flush()
}

func (r *response) abort() {
	if conn, _, err := r.rc.Hijack(); err == nil {
		_ = conn.Close()
	}
}

// relay copies the body to the client; at its end it settles and publishes the event, and
// ends a detached stream. It reports whether it handed the stream off instead (detached, or
// parked, see detach.go and park.go): the handler must then return at once, and resume goes
// on, on another goroutine.
func (c *flight) relay(out client) (handedOff bool) {
	p := c.p
	c.rl = relay{out: out, dog: &c.dog, m: c.m, bufs: &p.bufs, body: upstreamBody{r: c.body, dog: &c.dog}}
	if c.w != nil {
		c.rl.hold = c.waitOrLeave
	}
	rl := &c.rl
	switch c.enc {
	case identity:
		if handedOff, _ := rl.measured(&rl.body); handedOff {
			return true // the flight is another goroutine's now
		}
	case gzipped:
		zr, _ := p.gzips.Get().(*gzip.Reader)
		if zr == nil {
			zr = new(gzip.Reader)
		}
		rl.gunzipped(zr, c.strip)
		p.gzips.Put(zr)
	default:
		rl.raw()
	}
	c.settle()
	return false
}

// relayBuffered relays what came from the upstream with the response's head, before the loop
// takes the stream; it reports whether the stream ended with it (the body, or the client).
func (c *flight) relayBuffered(b *h1Body) (ended bool) {
	rl := &c.rl
	defer rl.release()
	for b.conn.buffered() > 0 && !b.finished {
		n, err := rl.body.Read(rl.buf())
		if n > 0 && !rl.feed(rl.buf()[:n]) {
			return true
		}
		if err != nil {
			return true
		}
	}
	b.conn.release()
	return b.finished
}

// resume goes on with a stream handed off.
func (c *flight) resume() {
	if handedOff, _ := c.rl.measured(&c.rl.body); !handedOff {
		c.settle()
	}
}

// settle finishes a relay whose body ended: it sends what the meter held back, works out and
// publishes the event, and ends a detached stream.
func (c *flight) settle() {
	p, rl := c.p, &c.rl
	c.dog.stop()
	end := time.Now()
	if c.enc != other {
		rl.tail(end)
	}
	rl.release()
	_ = c.body.Close()
	cause := context.Cause(c.ctx)
	gone := errors.Is(cause, errClientGone)
	readErr, writeErr := rl.body.err, rl.writeErr
	res := c.m.Result(end)
	// A client that has the terminal event ([DONE], message_stop) has the whole answer: what
	// the upstream does after it is nothing to a client that hung up, nor to one reading on
	// while the upstream falls silent instead of ending the body (that body is ended for it).
	idleAfterEnd := errors.Is(cause, errStreamIdle) && writeErr == nil && res.Done
	whole := (gone && writeErr == nil && res.Done) || idleAfterEnd
	if (readErr != nil || (rl.badGzip != nil && c.strip)) && writeErr == nil && !gone && !idleAfterEnd {
		// The upstream broke off, or its stream cannot be decoded for the client: break the
		// client's connection too, so its SDK sees the failure it would have seen talking
		// to the upstream directly.
		rl.out.abort()
	}
	ev := &c.ev
	res.Fill(ev)
	if res.Overflows > 0 {
		p.m.overflows.Inc()
	}
	ok := c.status < 300
	switch {
	case errors.Is(cause, errShutdown) && (readErr != nil || writeErr != nil):
		ev.Status, ev.ErrorCode = events.StatusError, CodeShutdown
	case writeErr != nil || (readErr != nil && gone && !whole):
		ev.Status, ev.ErrorCode = events.StatusCanceled, CodeClientGone
	case errors.Is(cause, errStreamIdle) && !whole:
		ev.Status, ev.ErrorCode = events.StatusTimeout, CodeStreamIdle
	case !ok:
		ev.Status, ev.ErrorCode = events.StatusError, strconv.Itoa(c.status)
	case readErr != nil && !whole:
		ev.Status, ev.ErrorCode = events.StatusError, CodeUpstreamDisconnect
	case rl.badGzip != nil:
		ev.Status, ev.ErrorCode = events.StatusError, CodeMalformedGzip
	case c.enc == other:
		// Encoded in a way the meter cannot read: the HTTP status is all there is.
		ev.Status, ev.ErrorCode = events.StatusOK, ""
	default:
		ev.Status, ev.ErrorCode = res.Status(c.sse)
	}
	if !c.sse && c.stream && ok {
		// A streaming request answered with a plain body: measured as one.
		ev.Stream = false
	}
	if c.sse {
		p.m.streams.Dec()
	}
	c.close()
	p.meters.Put(c.m)
	c.m = nil
	p.finish(ev, end)
	p.flights.remove(c)
	if c.d != nil {
		c.d.end(readErr == nil && writeErr == nil && (rl.badGzip == nil || !c.strip) && cause == nil)
	}
}

func (p *Proxy) labels(ev *events.RequestEvent, h http.Header) {
	ev.Scene = headerOr(h, HeaderScene, p.cfg.DefaultScene)
	ev.Env = headerOr(h, HeaderEnv, p.cfg.DefaultEnv)
	ev.Tenant = h.Get(HeaderTenant)
	ev.ConversationID = h.Get(HeaderConversation)
	// A turn the event cannot carry is left out, as one that is not a number, rather than
	// make the event invalid.
	if t, err := strconv.Atoi(h.Get(HeaderTurn)); err == nil && t > 0 && t <= events.MaxTurn {
		ev.Turn = t
	}
}

func headerOr(h http.Header, name, def string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	return def
}

func (p *Proxy) finish(ev *events.RequestEvent, end time.Time) {
	p.m.observe(ev, end)
	// Over-long labels from the client are fitted by the emitter, and counted; an event it
	// still finds invalid is counted there too.
	_ = p.emit.Emit(ev, end)
}

func msSince(start, end time.Time) float64 { return float64(end.Sub(start).Microseconds()) / 1000 }
