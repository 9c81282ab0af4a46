package events

import (
	"errors"
	"strconv"
)

// ErrInvalidEvent is wrapped by every error that rejects a message: malformed JSON and
// failed validation alike. Match it with errors.Is.
var ErrInvalidEvent = errors.New("invalid event")

// The reasons a message is rejected; each error this package returns wraps one of them
// and ErrInvalidEvent.
var (
	ErrMalformed          = errors.New("malformed JSON")
	ErrUnsupportedVersion = errors.New("unsupported version")
	ErrMissingField       = errors.New("missing required field")
	ErrNegative           = errors.New("negative value")
	ErrOutOfRange         = errors.New("value out of range")
	ErrTTFTAboveTotal     = errors.New("ttft_ms is above total_ms")
	ErrUnknownStatus      = errors.New("unknown value")
	ErrFutureTimestamp    = errors.New("timestamp too far in the future")
	ErrNotUTF8            = errors.New("not valid UTF-8")
	ErrTooLong            = errors.New("too long")
	ErrWrongType          = errors.New("wrong JSON type")
	ErrBadTimestamp       = errors.New("not an RFC 3339 timestamp")
	ErrBadTraceID         = errors.New("not a W3C trace id (32 lowercase hex digits, not all zero)")
	// ErrReusedEventID rejects a feedback event whose event_id an earlier verdict with
	// another value (or on another request, conversation, name or source) already has: a
	// changed verdict is a new verdict, with an event_id of its own.
	ErrReusedEventID = errors.New("event_id already names another verdict")
)

// reasons maps each sentinel to the bounded label it is counted under.
var reasons = []struct {
	err   error
	label string
}{
	{ErrMalformed, "malformed"},
	{ErrWrongType, "wrong_type"},
	{ErrBadTimestamp, "bad_timestamp"},
	{ErrUnsupportedVersion, "unsupported_version"},
	{ErrMissingField, "missing_field"},
	{ErrNegative, "negative"},
	{ErrOutOfRange, "out_of_range"},
	{ErrTTFTAboveTotal, "ttft_above_total"},
	{ErrUnknownStatus, "unknown_value"},
	{ErrFutureTimestamp, "future_timestamp"},
	{ErrNotUTF8, "not_utf8"},
	{ErrTooLong, "too_long"},
	{ErrBadTraceID, "bad_trace_id"},
	{ErrReusedEventID, "reused_event_id"},
}

// Reasons lists every label Reason can return, for pre-setting metric label values.
func Reasons() []string {
	out := make([]string, 0, len(reasons)+1)
	for _, r := range reasons {
		out = append(out, r.label)
	}
	return append(out, "other")
}

// Reason returns the bounded metric label for why err rejected a message.
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "other"
}

// FieldError says which field of a message is wrong and why.
type FieldError struct {
	Field  string // the JSON name
	Err    error  // one of the sentinels above
	Detail string // the offending value or the limit, for people
}

func (e *FieldError) Error() string {
	s := "invalid event: " + e.Field + ": " + e.Err.Error()
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

// Unwrap lets errors.Is match both ErrInvalidEvent and the specific reason.
func (e *FieldError) Unwrap() []error { return []error{ErrInvalidEvent, e.Err} }

// SyntaxError is returned for input that is not the JSON a message must be.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return "invalid event: malformed JSON at offset " + strconv.Itoa(e.Offset) + ": " + e.Msg
}

// Unwrap lets errors.Is match ErrInvalidEvent and ErrMalformed.
func (e *SyntaxError) Unwrap() []error { return []error{ErrInvalidEvent, ErrMalformed} }

// ReusedEventIDError returns the error of a feedback event whose event_id an earlier,
// different verdict already has (ErrReusedEventID); detail says which part differs.
func ReusedEventIDError(detail string) error { return fieldErr("event_id", ErrReusedEventID, detail) }

func fieldErr(field string, err error, detail string) error {
	return &FieldError{Field: field, Err: err, Detail: detail}
}
