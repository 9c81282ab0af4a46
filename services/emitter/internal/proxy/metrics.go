package proxy

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
)

type metrics struct {
	requests    *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	retryAfter  *prometheus.HistogramVec
	inflight    prometheus.Gauge
	streams     prometheus.Gauge
	detached    prometheus.Gauge
	detaches    prometheus.Counter
	parked      prometheus.Gauge
	clientWaits prometheus.Counter
	ttft        *prometheus.HistogramVec
	passthrough prometheus.Counter
	overflows   prometheus.Counter
	refused     *prometheus.CounterVec
	framing     *prometheus.CounterVec
	unparsed    *prometheus.CounterVec
	models      *ops.Limiter
}

// Why a request body was forwarded unread (emitter_proxy_unparsed_bodies_total).
const (
	unparsedTooLarge = "too_large" // over EMITTER_MAX_PARSE_BYTES
	unparsedMemory   = "memory"    // the request bodies held already take EMITTER_MAX_PARSE_MEMORY
)

// labelIdle is how long a model label must go unseen before a new model may take its place.
const labelIdle = 5 * time.Minute

func newMetrics(reg prometheus.Registerer, maxLabels int) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "requests_total",
			Help: "Proxied LLM requests by provider, model (bounded) and status."}, []string{"provider", "model", "status"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "rate_limited_total",
			Help: "Upstream responses with HTTP 429, by provider."}, []string{"provider"}),
		retryAfter: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "emitter", Subsystem: "proxy", Name: "rate_limit_retry_after_seconds",
			Help:    "The wait upstream 429 responses asked for (Retry-After, or retry-after-ms), by provider.",
			Buckets: []float64{1, 2, 5, 10, 30, 60, 120, 300, 600, 3600}}, []string{"provider"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "emitter", Subsystem: "proxy", Name: "inflight_requests",
			Help: "Proxied requests in progress."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "emitter", Subsystem: "proxy", Name: "inflight_streams",
			Help: "Streamed (SSE) responses being relayed: the gateway's concurrent open streams."}),
		detached: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "emitter", Subsystem: "proxy", Name: "detached_streams",
			Help: "Open streams the proxy relays itself, off net/http: those open for half a second or more."}),
		detaches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "detached_streams_total",
			Help: "Streams the proxy took off net/http."}),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "emitter", Subsystem: "proxy", Name: "parked_streams",
			Help: "Detached streams held without a goroutine: on the relay loop, or silent and waiting in the watcher."}),
		clientWaits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "client_waits_total",
			Help: "Chunks a client's socket did not take at once: the relay waited for a slow client, the upstream's bytes held meanwhile."}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "emitter", Subsystem: "proxy", Name: "ttft_seconds",
			Help:    "Time to the first content event of successful streamed requests.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60}}, []string{"provider", "model"}),
		passthrough: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "passthrough_total",
			Help: "Requests to other upstream paths (model lists, token counting) forwarded without measuring; those no upstream takes (EMITTER_UPSTREAM_URL=none) are in emitter_proxy_refused_total{reason=\"proxy_off\"}."}),
		overflows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "meter_overflows_total",
			Help: "Responses with an SSE event longer than EMITTER_MAX_SSE_EVENT_BYTES (or a body over 8 MiB), passed to the client as it came: unread, the event marked meter_overflow, or, a Responses API event, read as it passed."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "refused_total",
			Help: "Requests refused before going upstream, by reason: a path whose segments an upstream could read otherwise (dot_segment, encoded_slash: 400), or no upstream for it, EMITTER_UPSTREAM_URL=none and no EMITTER_UPSTREAMS route (proxy_off: 503)."}, []string{"reason"}),
		framing: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "ambiguous_framing_total",
			Help: "Request heads whose framing a server and a proxy in front could read differently, by problem: their connection is closed after the answer (transfer_encoding_http10: refused with 400)."}, []string{"problem"}),
		unparsed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "proxy", Name: "unparsed_bodies_total",
			Help: "Request bodies forwarded upstream unread (model unknown, tokens estimated), by reason: too_large (over EMITTER_MAX_PARSE_BYTES) or memory (the request bodies held, proxy, ingest and OTLP, already took EMITTER_MAX_PARSE_MEMORY)."}, []string{"reason"}),
	}
	// A model unseen for labelIdle gives its place to a new one once maxLabels are in use,
	// and its series go, so /metrics never holds more than maxLabels models.
	m.models = ops.NewLimiter(maxLabels, labelIdle, func(model string) {
		m.requests.DeletePartialMatch(prometheus.Labels{"model": model})
		m.ttft.DeletePartialMatch(prometheus.Labels{"model": model})
	})
	for _, r := range refusedReasons {
		m.refused.WithLabelValues(r)
	}
	for _, f := range framingProblems {
		m.framing.WithLabelValues(f)
	}
	for _, r := range []string{unparsedTooLarge, unparsedMemory} {
		m.unparsed.WithLabelValues(r)
	}
	for _, p := range []string{"openai", "anthropic"} {
		m.rateLimited.WithLabelValues(p)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.rateLimited, m.retryAfter, m.inflight, m.streams, m.detached, m.detaches, m.parked, m.clientWaits, m.ttft, m.passthrough, m.overflows, m.refused, m.framing, m.unparsed)
	}
	return m
}

func (m *metrics) observe(ev *events.RequestEvent, now time.Time) {
	model := m.models.Value(ev.Model, now)
	m.requests.WithLabelValues(ev.Provider, model, string(ev.Status)).Inc()
	if ev.RateLimited() {
		m.rateLimited.WithLabelValues(ev.Provider).Inc()
	}
	if ev.Status == events.StatusOK && ev.Stream {
		m.ttft.WithLabelValues(ev.Provider, model).Observe(ev.TTFTMs / 1000)
	}
}

// maxRetryAfter is the longest wait the histogram counts, in seconds, its top bucket: a
// longer one counts as it, so that one value, however large, cannot outweigh the others in
// the sum.
const maxRetryAfter = 3600

// retryAfter is the wait an answer asks for, at most maxRetryAfter: retry-after-ms (OpenAI's,
// which its SDKs read first), a decimal number of milliseconds, else Retry-After in seconds
// or as an HTTP date (RFC 9110, 10.2.3); ok is false when it asks for none that parses.
func retryAfter(h http.Header, now time.Time) (seconds float64, ok bool) {
	if v := h.Get("Retry-After-Ms"); isDecimal(v) {
		ms, _ := strconv.ParseFloat(v, 64) // a decimal too large is +Inf: past the cap
		return min(ms/1000, maxRetryAfter), true
	}
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if isDecimal(v) && !strings.Contains(v, ".") {
		s, _ := strconv.ParseFloat(v, 64)
		return min(s, maxRetryAfter), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now).Seconds(), 0), maxRetryAfter), true
	}
	return 0, false
}

// isDecimal reports whether v is digits, with a fraction of digits or without: no sign, no
// exponent, no hex (which strconv.ParseFloat would take).
func isDecimal(v string) bool {
	whole, frac, dot := strings.Cut(v, ".")
	digits := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
		return s != ""
	}
	return digits(whole) && (!dot || digits(frac))
}
