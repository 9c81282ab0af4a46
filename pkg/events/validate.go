package events

import (
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits that Validate enforces. They are generous: they reject garbage (a counter sent as
// a token count, a timestamp from a clock set years ahead), not unusual traffic.
const (
	MaxTokens       = 100_000_000     // per request, input or output
	MaxDurationMs   = 7 * 24 * 3600e3 // a week; anything longer is a unit mistake
	MaxClockSkew    = 5 * time.Minute // how far in the future ts may be
	MaxIDLen        = 128             // event_id, conversation_id
	MaxLabelLen     = 256             // model, scene, env and the other labels
	MaxTurn         = 1_000_000       // turns per conversation
	minTimestampStr = "2000-01-01T00:00:00Z"
)

var minTimestamp, _ = time.Parse(time.RFC3339, minTimestampStr)

// Validate checks the event against the contract using the current time for the
// future-timestamp rule. See ValidateAt.
func (e *RequestEvent) Validate() error { return e.ValidateAt(time.Now()) }

// ValidateAt checks the event against the contract; now bounds how far in the future ts may
// be. The error names the field and wraps ErrInvalidEvent and the reason's sentinel.
func (e *RequestEvent) ValidateAt(now time.Time) error {
	if e.V != Version {
		if e.V == 0 {
			return fieldErr("v", ErrMissingField, "")
		}
		return fieldErr("v", ErrUnsupportedVersion, strconv.Itoa(e.V))
	}
	if err := checkEventID(e.EventID); err != nil {
		return err
	}
	if err := checkTime("ts", e.TS, now); err != nil {
		return err
	}
	for _, l := range [...]struct {
		name, v  string
		required bool
	}{
		{"model", e.Model, true},
		{"scene", e.Scene, true},
		{"env", e.Env, true},
		{"instance", e.Instance, false},
		{"tenant", e.Tenant, false},
		{"provider", e.Provider, false},
		{"error_code", e.ErrorCode, false},
	} {
		if err := checkLabel(l.name, l.v, l.required); err != nil {
			return err
		}
	}
	if err := checkID("conversation_id", e.ConversationID, false); err != nil {
		return err
	}
	if err := checkTokens("input_tokens", e.InputTokens); err != nil {
		return err
	}
	if err := checkTokens("output_tokens", e.OutputTokens); err != nil {
		return err
	}
	if err := checkTokens("cached_input_tokens", e.CachedInputTokens); err != nil {
		return err
	}
	if e.CachedInputTokens > e.InputTokens {
		return fieldErr("cached_input_tokens", ErrOutOfRange, "above input_tokens")
	}
	for _, d := range [...]struct {
		name string
		v    float64
	}{
		{"ttft_ms", e.TTFTMs}, {"total_ms", e.TotalMs}, {"max_itl_ms", e.MaxITLMs},
		{"queue_ms", e.QueueMs}, {"prefill_ms", e.PrefillMs}, {"decode_ms", e.DecodeMs},
	} {
		if err := checkDuration(d.name, d.v); err != nil {
			return err
		}
	}
	if e.TTFTMs > e.TotalMs {
		return fieldErr("ttft_ms", ErrTTFTAboveTotal, formatMs(e.TTFTMs)+" > "+formatMs(e.TotalMs))
	}
	if e.MaxITLMs > e.TotalMs {
		return fieldErr("max_itl_ms", ErrOutOfRange, "above total_ms")
	}
	switch e.Status {
	case StatusOK, StatusError, StatusTimeout, StatusCanceled:
	case "":
		return fieldErr("status", ErrMissingField, "")
	default:
		return fieldErr("status", ErrUnknownStatus, quoteBounded(string(e.Status)))
	}
	switch e.Layer {
	case "", LayerGateway, LayerEngine, LayerApp:
	default:
		return fieldErr("layer", ErrUnknownStatus, quoteBounded(string(e.Layer)))
	}
	if e.TraceID != "" && !ValidTraceID(e.TraceID) {
		return fieldErr("trace_id", ErrBadTraceID, quoteBounded(e.TraceID))
	}
	switch e.Outcome {
	case "", OutcomeCompleted, OutcomeAbandoned:
	default:
		return fieldErr("outcome", ErrUnknownStatus, quoteBounded(string(e.Outcome)))
	}
	if e.HTTPStatus < 0 || e.HTTPStatus > 999 {
		return fieldErr("http_status", ErrOutOfRange, strconv.Itoa(e.HTTPStatus))
	}
	if e.Turn < 0 {
		return fieldErr("turn", ErrNegative, strconv.Itoa(e.Turn))
	}
	if e.Turn > MaxTurn {
		return fieldErr("turn", ErrOutOfRange, strconv.Itoa(e.Turn))
	}
	if len(e.Scores) > MaxScores {
		return fieldErr("scores", ErrOutOfRange, "more than "+strconv.Itoa(MaxScores)+" scores")
	}
	for i, sc := range e.Scores {
		if err := checkFeedbackName("scores", sc.Name); err != nil {
			return err
		}
		if v := sc.Value; math.IsNaN(v) || math.IsInf(v, 0) || math.Abs(v) > MaxFeedbackValue {
			return checkFeedbackValue("scores."+sc.Name, v) // the field named only on the error path
		}
		for _, prev := range e.Scores[:i] {
			if prev.Name == sc.Name {
				return fieldErr("scores."+sc.Name, ErrOutOfRange, "named twice")
			}
		}
	}
	return nil
}

// ValidTraceID reports whether s is a W3C Trace Context trace id: 32 lowercase hex digits,
// not all zero.
func ValidTraceID(s string) bool { return validHexID(s, 32) }

// ValidSpanID reports whether s is a W3C Trace Context parent (span) id: 16 lowercase hex
// digits, not all zero.
func ValidSpanID(s string) bool { return validHexID(s, 16) }

func validHexID(s string, n int) bool {
	if len(s) != n {
		return false
	}
	zero := true
	for i := 0; i < n; i++ {
		c := s[i]
		switch {
		case c == '0':
		case '1' <= c && c <= '9', 'a' <= c && c <= 'f':
			zero = false
		default:
			return false
		}
	}
	return !zero
}

func checkID(name, v string, required bool) error {
	switch {
	case v == "" && required:
		return fieldErr(name, ErrMissingField, "")
	case len(v) > MaxIDLen:
		return fieldErr(name, ErrTooLong, "over "+strconv.Itoa(MaxIDLen)+" bytes")
	case !utf8.ValidString(v):
		return fieldErr(name, ErrNotUTF8, "")
	}
	return nil
}

// checkEventID checks an event_id, which is also the message's Nats-Msg-Id header: a header
// value cannot hold a control character, and loses a space at either end, so such an id
// would stand for another one (" a" for "a") and JetStream would drop one of the two events
// as the other's duplicate.
func checkEventID(v string) error {
	if err := checkID("event_id", v, true); err != nil {
		return err
	}
	if v[0] == ' ' || v[len(v)-1] == ' ' {
		return fieldErr("event_id", ErrOutOfRange, "a space at either end: the id is also the Nats-Msg-Id header, which drops it")
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return fieldErr("event_id", ErrOutOfRange, "a control character: the id is also the Nats-Msg-Id header, which cannot hold it")
		}
	}
	return nil
}

func checkLabel(name, v string, required bool) error {
	switch {
	case v == "" && required:
		return fieldErr(name, ErrMissingField, "")
	case len(v) > MaxLabelLen:
		return fieldErr(name, ErrTooLong, "over "+strconv.Itoa(MaxLabelLen)+" bytes")
	case !utf8.ValidString(v):
		return fieldErr(name, ErrNotUTF8, "")
	}
	return nil
}

func checkTime(name string, ts, now time.Time) error {
	switch {
	case ts.IsZero():
		return fieldErr(name, ErrMissingField, "")
	case ts.Before(minTimestamp):
		return fieldErr(name, ErrOutOfRange, "before "+minTimestampStr)
	case ts.Sub(now) > MaxClockSkew:
		return fieldErr(name, ErrFutureTimestamp, ts.UTC().Format(time.RFC3339Nano)+" is more than "+MaxClockSkew.String()+" ahead")
	}
	return nil
}

func checkTokens(name string, v int64) error {
	switch {
	case v < 0:
		return fieldErr(name, ErrNegative, strconv.FormatInt(v, 10))
	case v > MaxTokens:
		return fieldErr(name, ErrOutOfRange, strconv.FormatInt(v, 10)+" > "+strconv.Itoa(MaxTokens))
	}
	return nil
}

func checkDuration(name string, v float64) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fieldErr(name, ErrOutOfRange, "not a finite number")
	case v < 0:
		return fieldErr(name, ErrNegative, formatMs(v))
	case v > MaxDurationMs:
		return fieldErr(name, ErrOutOfRange, formatMs(v)+" ms is over a week")
	}
	return nil
}

func formatMs(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// quoteBounded quotes a bad value for an error message without letting a huge or
// binary value through.
func quoteBounded(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strconv.QuoteToASCII(s)
}

// FitLabel returns v made to pass Validate's rules for a label or id of at most limit bytes,
// for a producer that measured a request and must not lose its event over a label it was
// handed (the emitter's proxy, taking scene and env from headers and the model from the
// body): invalid UTF-8 becomes U+FFFD, and a value longer than limit is cut on a rune
// boundary and ended with '~' and 8 hex digits of the FNV-1a hash of the whole value, so
// that long values which begin alike stay apart. A value that already fits is returned as
// it is. A producer that can be told its event is wrong should be told instead: the HTTP
// ingest and the aggregator reject such events.
func FitLabel(v string, limit int) string {
	if len(v) <= limit && utf8.ValidString(v) {
		return v
	}
	v = strings.ToValidUTF8(v, "\uFFFD")
	if len(v) <= limit {
		return v
	}
	const hexDigits = "0123456789abcdef"
	tail := []byte("~00000000")
	if limit < len(tail) {
		tail = tail[:0] // no room for the hash: cut only
	} else {
		h := fnv.New32a()
		_, _ = h.Write([]byte(v))
		sum := h.Sum32()
		for i := len(tail) - 1; i > 0; i-- {
			tail[i] = hexDigits[sum&0xf]
			sum >>= 4
		}
	}
	keep := max(limit-len(tail), 0)
	for keep > 0 && !utf8.RuneStart(v[keep]) {
		keep--
	}
	return v[:keep] + string(tail)
}
