package otlp

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/collector/pdata/ptrace"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

// maxReported bounds the spans named in a partial success's error message; the count
// covers all of them.
const maxReported = 10

// Publisher takes an encoded event without blocking and says whether it holds it;
// bus.Publisher is one. data stays untouched once handed over.
type Publisher interface {
	Publish(subject, msgID string, data []byte) bool
}

// DefaultStoreWait is how long an export waits for room in the publisher and for
// JetStream's acks before a retryable answer: under the exporters' own timeout (10 s).
const DefaultStoreWait = 5 * time.Second

// Options configure the receiver.
type Options struct {
	Labels   Labels
	MaxBytes int64          // largest request, compressed and decompressed; larger ones are refused
	Token    string         // bearer token required when not empty
	Subjects *subject.Limit // bounds the subjects published on; nil: one per env and scene
	// Budget is the memory the requests being read and handled take, shared with the
	// process's other request bodies: an HTTP body as it arrives and once decompressed, a
	// gRPC message MaxBytes from before grpc-go reads it. A request that does not fit is
	// refused as retryable (503, Unavailable). nil: one of its own.
	Budget *reqbody.Budget
	// BodyIdle is how long an HTTP body may send nothing, and a gRPC call wait for its
	// message, before the request is given up; 0: reqbody.IdleTimeout.
	BodyIdle time.Duration
	// StoreWait bounds an export's wait for its events to be stored; 0: DefaultStoreWait.
	StoreWait time.Duration
}

// Receiver turns exported spans into request events and publishes them. Its ServeHTTP is
// OTLP/HTTP's POST /v1/traces; GRPC gives OTLP/gRPC's TraceService.
type Receiver struct {
	opts   Options
	pub    Publisher
	now    func() time.Time
	logger *slog.Logger
	m      *metrics

	// slots bounds the requests read and decoded at once, so memory is bounded by
	// their number times MaxBytes whatever the clients send.
	slots chan struct{}
}

type metrics struct {
	requests *prometheus.CounterVec
	accepted *prometheus.CounterVec
	ignored  prometheus.Counter
	rejected *prometheus.CounterVec

	refusedHTTP, refusedGRPC prometheus.Counter // requests the budget had no room for
}

// New returns a receiver publishing through pub; now is the clock events are validated
// against.
func New(opts Options, pub Publisher, now func() time.Time, reg prometheus.Registerer, logger *slog.Logger) *Receiver {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 16 << 20
	}
	if opts.Budget == nil {
		opts.Budget = reqbody.NewBudget(reqbody.DefaultLimit, nil)
	}
	if opts.StoreWait <= 0 {
		opts.StoreWait = DefaultStoreWait
	}
	r := &Receiver{opts: opts, pub: pub, now: now, logger: logger.With("component", "otlp"),
		slots: make(chan struct{}, 2*runtime.GOMAXPROCS(0)),
		m: &metrics{
			requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "otlp", Name: "requests_total",
				Help: "OTLP export requests, by transport (http, grpc) and answer (HTTP status or gRPC code)."}, []string{"transport", "code"}),
			accepted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "otlp", Name: "spans_accepted_total",
				Help: "Spans turned into request events and handed to the publisher, by layer."}, []string{"layer"}),
			ignored: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "otlp", Name: "spans_ignored_total",
				Help: "Spans that are not one LLM request (neither an engine's llm_request nor a GenAI inference span)."}),
			rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "otlp", Name: "spans_rejected_total",
				Help: "LLM request spans rejected, by reason (validation reasons, or dropped when the publish buffer is full)."}, []string{"reason"}),
			refusedHTTP: opts.Budget.Refusals("otlp_http"),
			refusedGRPC: opts.Budget.Refusals("otlp_grpc"),
		},
	}
	for _, code := range []string{"200", "400", "401", "408", "413", "415", "500", "503"} {
		r.m.requests.WithLabelValues("http", code)
	}
	for _, code := range []string{"OK", "InvalidArgument", "Unauthenticated", "Unavailable", "DeadlineExceeded", "Internal"} {
		r.m.requests.WithLabelValues("grpc", code)
	}
	for _, l := range []string{"engine", "app"} {
		r.m.accepted.WithLabelValues(l)
	}
	for _, reason := range append(events.Reasons(), "dropped") {
		r.m.rejected.WithLabelValues(reason)
	}
	if reg != nil {
		reg.MustRegister(r.m.requests, r.m.accepted, r.m.ignored, r.m.rejected)
	}
	return r
}

// authorized reports whether header (an Authorization value) carries the token as its
// bearer credentials; the scheme is case-insensitive (RFC 9110, 11.1).
func (r *Receiver) authorized(header string) bool {
	if r.opts.Token == "" {
		return true
	}
	scheme, got, ok := strings.Cut(header, " ")
	got = strings.TrimLeft(got, " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(got), []byte(r.opts.Token)) == 1
}

// result is what became of one request's spans.
type result struct {
	accepted [3]int // by Kind
	ignored  int
	rejected int // rejected with a reason, not counting dropped
	dropped  int // valid, but the publisher had no room
	reasons  []reasonCount
	errs     []string // the first maxReported rejections
	storeErr error    // unless AckBuffered: why JetStream's acks of the accepted events did not all come
}

// storeFailure says why an export waiting for its events to be stored was not, and whether
// sending it again can store it.
func (res *result) storeFailure() (msg string, retry bool) {
	if errors.Is(res.storeErr, bus.ErrRefused) {
		return "cannot store the spans' events: " + res.storeErr.Error(), false
	}
	return fmt.Sprintf("JetStream has not confirmed that the events of %d spans are stored (%v): send the request again",
		res.accepted[KindEngine]+res.accepted[KindApp], res.storeErr), true
}

type reasonCount struct {
	reason string
	n      int
}

// message is the partial success's error_message: how many spans were rejected, for which
// reasons, and the first few of them.
func (res *result) message() string {
	if res.rejected == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("rejected ")
	b.WriteString(strconv.Itoa(res.rejected))
	b.WriteString(" spans (")
	for i, rc := range res.reasons {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(rc.reason)
		b.WriteByte(' ')
		b.WriteString(strconv.Itoa(rc.n))
	}
	b.WriteString("): ")
	b.WriteString(strings.Join(res.errs, "; "))
	if len(res.errs) < res.rejected {
		b.WriteString("; …")
	}
	return strings.ToValidUTF8(b.String(), "\uFFFD") // a protobuf string
}

// consume maps, validates and publishes every span of td; through wait, when not nil,
// waiting as long as ctx lets it for room in the publisher (waitStored then waits for
// JetStream to store the events).
func (r *Receiver) consume(ctx context.Context, td ptrace.Traces, wait *bus.Batch) result {
	b := batch{r: r, now: r.now(), ctx: ctx, wait: wait}
	rss := td.ResourceSpans()
	for i := 0; i < rss.Len(); i++ {
		rs := rss.At(i)
		res := r.opts.Labels.Resource(rs.Resource().Attributes())
		sss := rs.ScopeSpans()
		for j := 0; j < sss.Len(); j++ {
			spans := sss.At(j).Spans()
			for k := 0; k < spans.Len(); k++ {
				b.span(res, spans.At(k))
			}
		}
	}
	if b.res.ignored > 0 {
		r.m.ignored.Add(float64(b.res.ignored))
	}
	for _, k := range []Kind{KindEngine, KindApp} {
		if n := b.res.accepted[k]; n > 0 {
			r.m.accepted.WithLabelValues(k.String()).Add(float64(n))
		}
	}
	for _, rc := range b.res.reasons {
		r.m.rejected.WithLabelValues(rc.reason).Add(float64(rc.n))
	}
	if b.res.dropped > 0 {
		r.m.rejected.WithLabelValues("dropped").Add(float64(b.res.dropped))
	}
	return b.res
}

// waitStored waits, as long as ctx lets it, for JetStream to store what consume published
// through wait, when not nil. It is called once the request's memory and its slot are given
// back: what waits for NATS is the events, never the request they came in.
func (res *result) waitStored(ctx context.Context, wait *bus.Batch) {
	if wait != nil && res.dropped == 0 && res.accepted[KindEngine]+res.accepted[KindApp] > 0 {
		res.storeErr = wait.Wait(ctx)
	}
}

// batch is the work on one request's spans.
type batch struct {
	r    *Receiver
	now  time.Time
	ctx  context.Context
	wait *bus.Batch // the publisher's batch an export waits for; nil with AckBuffered
	ev   events.RequestEvent
	res  result

	arena []byte // the published payloads, never written again once handed over

	env, scene, subject string // the last subject, reused while the labels repeat
}

// arenaChunk is the size of the blocks payloads are encoded into.
const arenaChunk = 64 << 10

func (b *batch) span(res Resource, span ptrace.Span) {
	kind := Classify(span)
	if kind == KindOther {
		b.res.ignored++
		return
	}
	err := b.r.opts.Labels.Map(res, span, kind, &b.ev)
	if err == nil {
		err = b.ev.ValidateAt(b.now)
	}
	if err != nil {
		b.reject(span, events.Reason(err), err)
		return
	}
	// Once the buffer is full the rest of the batch is refused too: the exporter is told
	// to send the whole batch again, and JetStream drops what already got through by id.
	if b.res.dropped > 0 || !b.publish(b.subjectOf(&b.ev), b.ev.EventID, b.payload(&b.ev)) {
		b.res.dropped++
		return
	}
	b.res.accepted[kind]++
}

// publish hands an event to the publisher, through the export's batch when it waits for
// storage: that waits for room rather than refusing.
func (b *batch) publish(subject, id string, data []byte) bool {
	if b.wait != nil {
		return b.wait.Publish(b.ctx, subject, id, data) == nil
	}
	return b.r.pub.Publish(subject, id, data)
}

func (b *batch) payload(ev *events.RequestEvent) []byte {
	// Appending never writes over what is already in the arena, so a payload handed over
	// stays as it is even when a long event makes append move the arena.
	if cap(b.arena)-len(b.arena) < 1024 {
		b.arena = make([]byte, 0, arenaChunk)
	}
	start := len(b.arena)
	b.arena = events.AppendRequest(b.arena, ev)
	return b.arena[start:len(b.arena):len(b.arena)]
}

// subjectOf returns the subject to publish ev on, reusing the last one while the labels
// repeat, as the HTTP ingest does.
func (b *batch) subjectOf(ev *events.RequestEvent) string {
	if b.subject == "" || ev.Env != b.env || ev.Scene != b.scene {
		b.env, b.scene = ev.Env, ev.Scene
		if b.r.opts.Subjects != nil {
			b.subject = b.r.opts.Subjects.Request(ev.Env, ev.Scene, b.now)
		} else {
			b.subject = events.RequestSubject(ev.Env, ev.Scene)
		}
	}
	return b.subject
}

func (b *batch) reject(span ptrace.Span, reason string, err error) {
	b.res.rejected++
	found := false
	for i := range b.res.reasons {
		if b.res.reasons[i].reason == reason {
			b.res.reasons[i].n++
			found = true
			break
		}
	}
	if !found {
		b.res.reasons = append(b.res.reasons, reasonCount{reason, 1})
	}
	if len(b.res.errs) < maxReported {
		sid := span.SpanID()
		b.res.errs = append(b.res.errs, fmt.Sprintf("span %x %s: %v", sid[:], quoteName(span.Name()), err))
	}
}

// quoteName quotes a span name for a message, cut to 64 bytes and made valid UTF-8: the
// message is a protobuf string.
func quoteName(name string) string {
	const limit = 64
	if len(name) > limit {
		cut := limit
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		name = name[:cut] + "…"
	}
	return strconv.Quote(strings.ToValidUTF8(name, "\uFFFD"))
}
