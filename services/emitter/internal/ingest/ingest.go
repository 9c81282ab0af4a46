package ingest

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

// MaxReportedErrors bounds the per-item errors in one answer; the count covers all of them.
const MaxReportedErrors = 100

// ErrDropped is the error of an event the publisher had no room for: NATS has been away
// too long.
var ErrDropped = errors.New("publish buffer full")

// Publisher takes an encoded event without blocking and says whether it holds it;
// bus.Publisher is one. data stays untouched once handed over.
type Publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// DefaultStoreWait is how long a request waits for room in the publisher and for
// JetStream's acks before it is answered 503.
const DefaultStoreWait = 10 * time.Second

// Options configure the handler.
type Options struct {
	MaxBytes int64          // largest body accepted; larger ones get 413
	Token    string         // bearer token required when not empty
	Subjects *subject.Limit // bounds the subjects published on; nil: one per env and scene
	// Budget is the memory the bodies being handled take, shared with the process's other
	// request bodies; a body that does not fit gets 503. nil: one of its own.
	Budget *reqbody.Budget
	// BodyIdle is how long a body may send nothing before it is answered 408;
	// 0: reqbody.IdleTimeout.
	BodyIdle time.Duration
	// StoreWait bounds a request's wait for its events to be stored; 0: DefaultStoreWait.
	StoreWait time.Duration
}

// Handler serves POST /v1/events (request events) or POST /v1/feedback (feedback events):
// the same body forms, answers, token, limits and metrics, for two contracts.
type Handler struct {
	opts   Options
	pub    Publisher
	now    func() time.Time
	logger *slog.Logger
	decode func(b *batch, raw []byte) (subject, msgID string, payload []byte, err error)

	batches  *prometheus.CounterVec
	accepted prometheus.Counter
	rejected *prometheus.CounterVec
	refused  prometheus.Counter // bodies the budget had no room for
}

// New returns the handler of POST /v1/events, publishing request events through pub. now
// is the clock events are validated against.
func New(opts Options, pub Publisher, now func() time.Time, reg prometheus.Registerer, logger *slog.Logger) *Handler {
	return build(opts, pub, now, reg, logger, "ingest", "POST /v1/events", (*batch).request)
}

// NewFeedback returns the handler of POST /v1/feedback, publishing feedback events on
// llm.feedback.<env>.<scene> through pub, under the same rules and subject bound as New's.
func NewFeedback(opts Options, pub Publisher, now func() time.Time, reg prometheus.Registerer, logger *slog.Logger) *Handler {
	return build(opts, pub, now, reg, logger, "feedback", "POST /v1/feedback", (*batch).feedback)
}

func build(opts Options, pub Publisher, now func() time.Time, reg prometheus.Registerer, logger *slog.Logger,
	subsystem, route string, decode func(*batch, []byte) (string, string, []byte, error)) *Handler {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 16 << 20
	}
	if opts.Budget == nil {
		opts.Budget = reqbody.NewBudget(reqbody.DefaultLimit, nil)
	}
	if opts.StoreWait <= 0 {
		opts.StoreWait = DefaultStoreWait
	}
	h := &Handler{refused: opts.Budget.Refusals(subsystem), opts: opts, pub: pub, now: now, logger: logger.With("component", subsystem), decode: decode,
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: subsystem, Name: "requests_total",
			Help: route + " requests by HTTP status code."}, []string{"code"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: subsystem, Name: "events_accepted_total",
			Help: "Events accepted by " + route + " and handed to the publisher."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: subsystem, Name: "events_rejected_total",
			Help: "Events rejected by " + route + ", by reason (validation reasons, or dropped when the publish buffer is full)."}, []string{"reason"}),
	}
	for _, code := range []string{"200", "202", "400", "401", "408", "413", "415", "500", "503"} {
		h.batches.WithLabelValues(code)
	}
	for _, r := range append(events.Reasons(), "dropped") {
		h.rejected.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(h.batches, h.accepted, h.rejected)
	}
	return h
}

// ItemError is the error of one item of a batch.
type ItemError struct {
	Index int    `json:"index"` // 0-based position in the array or NDJSON lines
	Error string `json:"error"`
}

// Answer is the JSON body of every reply.
type Answer struct {
	Accepted int         `json:"accepted"`
	Stored   int         `json:"stored,omitempty"` // unless AckBuffered: the accepted events JetStream has stored
	Rejected int         `json:"rejected"`
	Errors   []ItemError `json:"errors,omitempty"`
	Error    string      `json:"error,omitempty"` // why the whole request was refused
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.opts.Token != "" && !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="tokenscope"`)
		h.reply(w, http.StatusUnauthorized, &Answer{Error: "missing or wrong bearer token"})
		return
	}
	wait, err := emit.StoreWait(h.pub, r.Header.Get(emit.AckHeader))
	if err != nil {
		h.reply(w, http.StatusBadRequest, &Answer{Error: err.Error()})
		return
	}
	// A compressed body would read as events that are all malformed, and a 400 would tell
	// the client not to send them again: say what is wrong instead.
	if enc := strings.TrimSpace(r.Header.Get("Content-Encoding")); enc != "" && !strings.EqualFold(enc, "identity") {
		h.reply(w, http.StatusUnsupportedMediaType, &Answer{Error: fmt.Sprintf("content encoding %s is not supported: send the body uncompressed",
			strconv.QuoteToASCII(cutString(enc, 64)))})
		return
	}
	body, held, err := reqbody.ReadRequest(w, r, h.opts.MaxBytes, h.opts.Budget, h.opts.BodyIdle)
	release := func() { h.opts.Budget.Release(held); held = 0 }
	defer release()
	switch {
	case errors.Is(err, reqbody.ErrTooLarge):
		h.reply(w, http.StatusRequestEntityTooLarge, &Answer{Error: fmt.Sprintf("body is over the %d byte limit", h.opts.MaxBytes)})
		return
	case errors.Is(err, reqbody.ErrBudgetFull):
		h.refused.Inc()
		w.Header().Set("Retry-After", "1")
		h.reply(w, http.StatusServiceUnavailable, &Answer{Error: "the emitter is holding its limit of request bodies: send the request again"})
		return
	case errors.Is(err, reqbody.ErrStalled):
		w.Header().Set("Connection", "close")
		h.reply(w, http.StatusRequestTimeout, &Answer{Error: "cannot read the body: " + err.Error()})
		return
	case err != nil:
		h.reply(w, http.StatusBadRequest, &Answer{Error: "cannot read the body: " + err.Error()})
		return
	}
	// The wait is bounded; it outlives a client that half-closes its connection, whose
	// request context net/http ends then, so that its stored events are answered as such.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.opts.StoreWait)
	defer cancel()
	ans := h.ingest(ctx, body, h.now(), wait)
	// The events are copied out: the body's memory goes back to the budget the proxy
	// shares before the wait for JetStream.
	body = nil
	release()
	if wait != nil && ans.Accepted > 0 {
		ans.storeErr = wait.Wait(ctx)
	}
	status := http.StatusAccepted
	switch {
	case errors.Is(ans.storeErr, bus.ErrRefused):
		// Sending them again cannot store them: counted in emitter_publish_dropped_total.
		status, ans.Error = http.StatusInternalServerError, "cannot store the accepted events: "+ans.storeErr.Error()
	case ans.storeErr != nil:
		status, ans.Error = http.StatusServiceUnavailable, fmt.Sprintf(
			"JetStream has not confirmed that the %d accepted events are stored (%v): send the request again; what was stored is dropped as a duplicate by its event_id",
			ans.Accepted, ans.storeErr)
		w.Header().Set("Retry-After", "1")
	case ans.Error != "":
		status = http.StatusBadRequest
	case wait != nil && ans.dropped > 0:
		// Some valid events found no room within the wait: the client sends the batch
		// again, and what got through is dropped as a duplicate by its event_id.
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	case ans.Accepted > 0 && wait != nil:
		status, ans.Stored = http.StatusOK, ans.Accepted
	case ans.Accepted > 0:
	case ans.dropped > 0:
		// Valid events the buffer had no room for: the client should send them again,
		// which a 400 would tell it not to.
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	case ans.Rejected == 0:
		status, ans.Error = http.StatusBadRequest, "no events in the body"
	default:
		status = http.StatusBadRequest
	}
	h.reply(w, status, &ans.Answer)
}

// cutString bounds a client's value quoted in an answer.
func cutString(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// authorized reports whether r carries the token as its bearer credentials. The scheme is
// case-insensitive and may be followed by more than one space (RFC 9110, 11.1 and 11.4).
func (h *Handler) authorized(r *http.Request) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	got = strings.TrimLeft(got, " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(got), []byte(h.opts.Token)) == 1
}

func (h *Handler) reply(w http.ResponseWriter, status int, a *Answer) {
	h.batches.WithLabelValues(strconv.Itoa(status)).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(a)
}

type result struct {
	Answer
	dropped  int
	storeErr error // unless AckBuffered: why JetStream's acks of the accepted events did not all come
}

// ingest decodes the body (one event, an array, or NDJSON), validates each event and
// publishes the valid ones; through wait, when not nil, waiting as long as ctx lets it for
// room in the publisher and then for JetStream to store them.
func (h *Handler) ingest(ctx context.Context, body []byte, now time.Time, wait *bus.Batch) result {
	b := batch{h: h, now: now, dec: events.NewDecoder(64), ctx: ctx, wait: wait}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return b.res
	}
	if trimmed[0] == '[' {
		if err := b.array(trimmed); err != nil {
			b.res.Error = "the body is not a JSON array of events: " + err.Error()
			return b.res
		}
		b.done()
		return b.res
	}
	// One event, possibly pretty-printed, or NDJSON: one event per line.
	if bytes.IndexByte(trimmed, '\n') < 0 || json.Valid(trimmed) {
		b.item(0, trimmed)
		b.done()
		return b.res
	}
	i := 0
	for len(trimmed) > 0 {
		line := trimmed
		if j := bytes.IndexByte(trimmed, '\n'); j >= 0 {
			line, trimmed = trimmed[:j], trimmed[j+1:]
		} else {
			trimmed = nil
		}
		if line = bytes.TrimSpace(line); len(line) == 0 {
			continue
		}
		b.item(i, line)
		i++
	}
	b.done()
	return b.res
}

// array handles the items of a JSON array one at a time: a slice of every item beside the
// body would hold ten times a body of millions of tiny items ("{}", numbers). The array is
// checked whole first, so a malformed one publishes none of its events. Each item is
// handled where it lies in the body, as NDJSON lines are: the strings an event holds alias
// memory nothing writes to while the batch runs.
func (b *batch) array(body []byte) error {
	if err := items(body, nil); err != nil {
		return err
	}
	i := 0
	return items(body, func(item []byte) { b.item(i, item); i++ })
}

// maxValidDepth is the nesting encoding/json reads: an item nested deeper is not checked
// with json.Valid, which would refuse it, and so the whole array, though it is JSON. The
// event decoder refuses it alone (nested too deeply), as it does on an NDJSON line.
const maxValidDepth = 10_000

// jsonSpace is the white space JSON allows between values.
const jsonSpace = " \t\r\n"

// items calls f, when not nil, with each item of the JSON array body, which begins with '['.
// The items are found by the brackets outside strings, so no nesting is too deep to find
// them, and each one nested no deeper than maxValidDepth is checked with json.Valid.
func items(body []byte, f func(item []byte)) error {
	n, start, depth, deepest := 0, 1, 0, 0
	end := func(i int) error {
		item, checked := bytes.Trim(body[start:i], jsonSpace), deepest <= maxValidDepth
		start, deepest = i+1, 0
		if f != nil {
			f(item)
		} else if checked && !json.Valid(item) {
			return fmt.Errorf("item %d: %w", n, json.Unmarshal(item, new(json.RawMessage)))
		}
		n++
		return nil
	}
	for i := 1; i < len(body); i++ {
		switch body[i] {
		case '"':
			for i++; i < len(body) && body[i] != '"'; i++ {
				if body[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case '}':
			if depth == 0 {
				return fmt.Errorf("unexpected '}' at offset %d", i)
			}
			depth--
		case ']':
			if depth > 0 {
				depth--
				break
			}
			if len(bytes.Trim(body[i+1:], jsonSpace)) > 0 {
				return fmt.Errorf("data after the array at offset %d", i+1)
			}
			if n == 0 && len(bytes.Trim(body[start:i], jsonSpace)) == 0 {
				return nil // []
			}
			return end(i)
		case ',':
			if depth == 0 {
				if err := end(i); err != nil {
					return err
				}
			}
		}
	}
	return errors.New("unexpected end of the array")
}

// batch is the work on one request's events.
type batch struct {
	h    *Handler
	now  time.Time
	ctx  context.Context
	wait *bus.Batch      // the publisher's batch a request waits for; nil with AckBuffered
	dec  *events.Decoder // interns the few label values; other strings alias the body
	ev   events.RequestEvent
	fb   events.FeedbackEvent
	res  result

	canon []byte // the event encoded by events.AppendRequest
	arena []byte // the published events' ids and payloads

	env, scene, subject string // the last subject, reused while the labels repeat
	fbSubject           string // subject under llm.feedback. for the same labels
}

// arenaChunk is the size of the blocks published ids and payloads are copied into.
const arenaChunk = 64 << 10

func (b *batch) item(i int, raw []byte) {
	subj, id, payload, err := b.h.decode(b, raw)
	if err != nil {
		b.reject(i, events.Reason(err), err)
		return
	}
	// Once the buffer is full the rest of the batch is refused too, so that what was
	// refused is every valid event from the first refused on, whatever room frees meanwhile.
	if b.res.dropped == 0 {
		if b.wait == nil {
			if b.h.pub.Publish(subj, id, payload) {
				b.res.Accepted++
				return
			}
		} else if err := b.wait.Publish(b.ctx, subj, id, payload); err == nil {
			b.res.Accepted++
			return
		}
	}
	b.res.dropped++
	if b.wait != nil {
		b.reject(i, "dropped", fmt.Errorf("cannot publish event %s: %w: no room came in %s", id, ErrDropped, b.h.opts.StoreWait))
		return
	}
	b.reject(i, "dropped", fmt.Errorf("cannot publish event %s: %w", id, ErrDropped))
}

// request decodes and validates one request event and returns where and what to publish.
func (b *batch) request(raw []byte) (subject, msgID string, payload []byte, err error) {
	b.ev = events.RequestEvent{}
	if err = b.dec.Decode(raw, &b.ev); err == nil {
		err = b.ev.ValidateAt(b.now)
	}
	if err != nil {
		return "", "", nil, err
	}
	b.canon = events.AppendRequest(b.canon[:0], &b.ev)
	id, payload := b.payload(b.ev.EventID)
	return b.subjectOf(b.ev.Env, b.ev.Scene), id, payload, nil
}

// feedback decodes and validates one feedback event; its subject is the request subject's
// env and scene under llm.feedback., so the two share one bound.
func (b *batch) feedback(raw []byte) (subject, msgID string, payload []byte, err error) {
	if err = b.dec.DecodeFeedback(raw, &b.fb); err == nil {
		err = b.fb.ValidateAt(b.now)
	}
	if err != nil {
		return "", "", nil, err
	}
	b.canon = events.AppendFeedback(b.canon[:0], &b.fb)
	fresh := b.subject == "" || b.fb.Env != b.env || b.fb.Scene != b.scene
	subj := b.subjectOf(b.fb.Env, b.fb.Scene)
	if fresh || b.fbSubject == "" {
		b.fbSubject = "llm.feedback." + strings.TrimPrefix(subj, "llm.req.")
	}
	id, payload := b.payload(b.fb.EventID)
	return b.fbSubject, id, payload, nil
}

// payload returns the bytes to publish: the canonical encoding in b.canon, so the stream
// holds one form whatever the client sent (no unknown fields, no spacing, UTC timestamps),
// copied with the event's id into the batch's arena. Neither aliases the body: what the
// publisher holds while NATS is away is the events, never the bodies they came in, however
// much else a body held. Both alias memory nothing writes to again.
func (b *batch) payload(id string) (string, []byte) {
	if n := len(id) + len(b.canon); cap(b.arena)-len(b.arena) < n {
		b.arena = make([]byte, 0, max(arenaChunk, n))
	}
	start := len(b.arena)
	b.arena = append(append(b.arena, id...), b.canon...)
	return unsafe.String(&b.arena[start], len(id)), b.arena[start+len(id) : len(b.arena) : len(b.arena)]
}

// subjectOf returns the subject to publish ev on. While the labels repeat the last subject
// is reused: seen once per run of them is enough for the subject limit's recency.
func (b *batch) subjectOf(env, scene string) string {
	if b.subject == "" || env != b.env || scene != b.scene {
		b.env, b.scene = env, scene
		if b.h.opts.Subjects != nil {
			b.subject = b.h.opts.Subjects.Request(env, scene, b.now)
		} else {
			b.subject = events.RequestSubject(env, scene)
		}
	}
	return b.subject
}

func (b *batch) reject(i int, reason string, err error) {
	b.res.Rejected++
	b.h.rejected.WithLabelValues(reason).Inc()
	if len(b.res.Errors) < MaxReportedErrors {
		b.res.Errors = append(b.res.Errors, ItemError{Index: i, Error: err.Error()})
	}
}

// done counts the accepted events once per request rather than once per event, and with
// AckStored waits for JetStream to store them.
func (b *batch) done() {
	b.h.accepted.Add(float64(b.res.Accepted))
}
