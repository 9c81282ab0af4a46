package ingest

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// MaxReportedErrors bounds the per-item errors in one answer; the count covers all of them.
const MaxReportedErrors = 100

// Emitter publishes one validated event without blocking; emit.Emitter is one.
type Emitter interface {
	Emit(ev *events.RequestEvent, now time.Time) error
}

// Options configure the handler.
type Options struct {
	MaxBytes int64  // largest body accepted; larger ones get 413
	Token    string // bearer token required when not empty
}

// Handler serves POST /v1/events.
type Handler struct {
	opts   Options
	emit   Emitter
	now    func() time.Time
	logger *slog.Logger

	batches  *prometheus.CounterVec
	accepted prometheus.Counter
	rejected *prometheus.CounterVec
}

// New returns the ingest handler. now is the clock events are validated against.
func New(opts Options, emit Emitter, now func() time.Time, reg prometheus.Registerer, logger *slog.Logger) *Handler {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 16 << 20
	}
	h := &Handler{opts: opts, emit: emit, now: now, logger: logger.With("component", "ingest"),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "ingest", Name: "requests_total",
			Help: "POST /v1/events requests by HTTP status code."}, []string{"code"}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "ingest", Name: "events_accepted_total",
			Help: "Events accepted and handed to the publisher."}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Subsystem: "ingest", Name: "events_rejected_total",
			Help: "Events rejected, by reason (validation reasons, or dropped when the publish buffer is full)."}, []string{"reason"}),
	}
	for _, code := range []string{"202", "400", "401", "413", "415", "503"} {
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
	if r.ContentLength > h.opts.MaxBytes {
		h.reply(w, http.StatusRequestEntityTooLarge, &Answer{Error: fmt.Sprintf("body of %d bytes is over the %d byte limit", r.ContentLength, h.opts.MaxBytes)})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.MaxBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.reply(w, http.StatusRequestEntityTooLarge, &Answer{Error: fmt.Sprintf("body is over the %d byte limit", h.opts.MaxBytes)})
			return
		}
		h.reply(w, http.StatusBadRequest, &Answer{Error: "cannot read the body: " + err.Error()})
		return
	}
	ans := h.ingest(body, h.now())
	status := http.StatusAccepted
	switch {
	case ans.Error != "":
		status = http.StatusBadRequest
	case ans.Accepted > 0:
	case ans.Rejected > 0 && ans.dropped == ans.Rejected:
		status = http.StatusServiceUnavailable
	case ans.Rejected == 0:
		status, ans.Error = http.StatusBadRequest, "no events in the body"
	default:
		status = http.StatusBadRequest
	}
	h.reply(w, status, &ans.Answer)
}

func (h *Handler) authorized(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(h.opts.Token)) == 1
}

func (h *Handler) reply(w http.ResponseWriter, status int, a *Answer) {
	h.batches.WithLabelValues(strconv.Itoa(status)).Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(a)
}

type result struct {
	Answer
	dropped int
}

// ingest decodes the body (one event, an array, or NDJSON) and emits each valid event.
func (h *Handler) ingest(body []byte, now time.Time) result {
	var res result
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return res
	}
	// The decoder interns the few label values of a batch; its other strings alias body,
	// which outlives every event: each is encoded again before publishing.
	dec := events.NewDecoder(64)
	item := func(i int, raw []byte) {
		var ev events.RequestEvent
		err := dec.Decode(raw, &ev)
		if err == nil {
			err = h.emit.Emit(&ev, now)
		}
		if err == nil {
			res.Accepted++
			h.accepted.Inc()
			return
		}
		res.Rejected++
		reason := "dropped"
		if errors.Is(err, events.ErrInvalidEvent) {
			reason = events.Reason(err)
		} else {
			res.dropped++
		}
		h.rejected.WithLabelValues(reason).Inc()
		if len(res.Errors) < MaxReportedErrors {
			res.Errors = append(res.Errors, ItemError{Index: i, Error: err.Error()})
		}
	}
	if trimmed[0] == '[' {
		var items []json.RawMessage
		if err := json.Unmarshal(trimmed, &items); err != nil {
			res.Error = "the body is not a JSON array of events: " + err.Error()
			return res
		}
		for i, raw := range items {
			item(i, raw)
		}
		return res
	}
	// One event, possibly pretty-printed, or NDJSON: one event per line.
	if bytes.IndexByte(trimmed, '\n') < 0 || json.Valid(trimmed) {
		item(0, trimmed)
		return res
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
		item(i, line)
		i++
	}
	return res
}
