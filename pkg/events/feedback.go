package events

import (
	"errors"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
	"unsafe"
)

// FeedbackSource says who gave a verdict.
type FeedbackSource string

// The sources a feedback event may carry.
const (
	SourceUser      FeedbackSource = "user"      // a person: thumbs, stars, a task marked done
	SourceEvaluator FeedbackSource = "evaluator" // a judge model or a rubric run offline
	SourceHeuristic FeedbackSource = "heuristic" // a rule: copied the answer, asked again
)

// Limits of a feedback event.
const (
	MaxFeedbackNameLen = 64        // name: letters, digits, '_', '-', '.'
	MaxFeedbackValue   = 1e9       // |value|
	MaxCommentLength   = 1_000_000 // comment_length, in characters
)

// FeedbackEvent is one verdict on a request, a conversation, or both: a user's thumbs or
// rating, an evaluator's quality score, a task marked completed. Value is a number; a JSON
// boolean is taken as 1 (true) or 0 (false). No free text is stored: a "comment" in the JSON
// is read only for its length (CommentLength, in characters) and dropped.
type FeedbackEvent struct {
	V int `json:"v"`
	// EventID names this verdict: sent again, it counts once; a changed verdict (a rating
	// made better) is a new verdict with an id of its own, and the aggregator dead-letters
	// one that reuses the id with another value as ErrReusedEventID.
	EventID string    `json:"event_id"`
	TS      time.Time `json:"ts"` // when the verdict was given

	RequestID      string `json:"request_id,omitempty"`      // the rated request event's event_id
	ConversationID string `json:"conversation_id,omitempty"` // the rated conversation

	Name   string         `json:"name"` // thumbs, rating, quality, task_completed, or the app's own
	Value  float64        `json:"value"`
	Source FeedbackSource `json:"source"`

	// What the sender knows of the rated request; the request's own labels win in queries.
	Scene string `json:"scene,omitempty"`
	Env   string `json:"env,omitempty"`
	Model string `json:"model,omitempty"`

	CommentLength int `json:"comment_length,omitempty"`
}

// UnmarshalFeedback decodes one feedback event from JSON into ev, replacing its contents,
// with the request decoder's rules: keys match exactly (a known key given twice, or in
// other letter case, is malformed), unknown fields are skipped (nested at most 64 deep),
// null counts as absent, and name and value must be present. It does not validate: call ValidateAt.
func UnmarshalFeedback(data []byte, ev *FeedbackEvent) error {
	d := decodeState{s: string(data)}
	return d.feedback(ev)
}

// DecodeFeedback is UnmarshalFeedback with dec's interning of labels (name, source, scene,
// env, model) and aliasing of every other string into data; see Decoder.
func (dec *Decoder) DecodeFeedback(data []byte, ev *FeedbackEvent) error {
	d := decodeState{s: unsafe.String(unsafe.SliceData(data), len(data)), dec: dec}
	return d.feedback(ev)
}

const (
	seenName = 1 << iota
	seenValue
)

func (d *decodeState) feedback(ev *FeedbackEvent) error {
	err := d.feedbackFields(ev)
	if err != nil && !errors.Is(err, ErrMalformed) {
		if v, ok := version(d.s); ok && v != Version && v != 0 {
			return fieldErr("v", ErrUnsupportedVersion, strconv.FormatInt(v, 10))
		}
	}
	return err
}

func (d *decodeState) feedbackFields(ev *FeedbackEvent) error {
	*ev = FeedbackEvent{}
	var seen uint8
	var keys uint64 // the known keys read, to refuse one given twice
	d.ws()
	if !d.take('{') {
		return d.syntax("expected a JSON object")
	}
	d.ws()
	if !d.take('}') {
		for {
			d.ws()
			key, err := d.str()
			if err != nil {
				return err
			}
			d.ws()
			if !d.take(':') {
				return d.syntax("expected ':' after object key")
			}
			d.ws()
			if err := d.known(&keys, feedbackKey(key), key, feedbackKeys); err != nil {
				return err
			}
			if err := d.feedbackField(ev, key, &seen); err != nil {
				return err
			}
			d.ws()
			if d.take(',') {
				continue
			}
			if d.take('}') {
				break
			}
			return d.syntax("expected ',' or '}' in object")
		}
	}
	d.ws()
	if d.i != len(d.s) {
		return d.syntax("unexpected data after the object")
	}
	switch {
	case seen&seenName == 0:
		return fieldErr("name", ErrMissingField, "")
	case seen&seenValue == 0:
		return fieldErr("value", ErrMissingField, "")
	}
	return nil
}

// feedbackKeys are the keys feedbackKey knows.
var feedbackKeys = []string{"v", "event_id", "ts", "request_id", "conversation_id", "name", "value", "source",
	"scene", "env", "model", "comment", "comment_length"}

// feedbackKey returns the bit of a feedback event's known key, 0 for another.
func feedbackKey(key string) uint64 {
	switch key {
	case "v":
		return 1 << 0
	case "event_id":
		return 1 << 1
	case "ts":
		return 1 << 2
	case "request_id":
		return 1 << 3
	case "conversation_id":
		return 1 << 4
	case "name":
		return 1 << 5
	case "value":
		return 1 << 6
	case "source":
		return 1 << 7
	case "scene":
		return 1 << 8
	case "env":
		return 1 << 9
	case "model":
		return 1 << 10
	case "comment":
		return 1 << 11
	case "comment_length":
		return 1 << 12
	}
	return 0
}

func (d *decodeState) feedbackField(ev *FeedbackEvent, key string, seen *uint8) error {
	if d.null() {
		return nil
	}
	var err error
	switch key {
	case "v":
		var n int64
		n, err = d.integer(key)
		ev.V = int(n)
	case "event_id":
		ev.EventID, err = d.strValue(key)
	case "ts":
		var s string
		if s, err = d.strValue(key); err == nil {
			ev.TS, err = parseTS(key, s)
		}
	case "request_id":
		ev.RequestID, err = d.strValue(key)
	case "conversation_id":
		ev.ConversationID, err = d.strValue(key)
	case "name":
		ev.Name, err = d.label(key)
		*seen |= seenName
	case "value":
		switch {
		case d.literal("true"):
			ev.Value = 1
		case d.literal("false"):
			ev.Value = 0
		default:
			if d.i < len(d.s) && d.s[d.i] != '-' && (d.s[d.i] < '0' || d.s[d.i] > '9') {
				if err = d.skip(0); err == nil {
					err = fieldErr(key, ErrWrongType, "want a number or true/false")
				}
				break
			}
			ev.Value, err = d.float(key)
		}
		*seen |= seenValue
	case "source":
		var s string
		if s, err = d.label(key); err == nil {
			ev.Source = FeedbackSource(s)
		}
	case "scene":
		ev.Scene, err = d.label(key)
	case "env":
		ev.Env, err = d.label(key)
	case "model":
		ev.Model, err = d.label(key)
	case "comment":
		// Free text is never kept: only its length in characters.
		var s string
		if s, err = d.strValue(key); err == nil {
			ev.CommentLength = utf8.RuneCountInString(s)
		}
	case "comment_length":
		var n int64
		n, err = d.integer(key)
		ev.CommentLength = int(min(max(n, -1), MaxCommentLength+1))
	default:
		err = d.skip(0)
	}
	return err
}

// ValidateAt checks the feedback event against the contract; now bounds how far in the
// future ts may be. The error names the field and wraps ErrInvalidEvent and the reason.
func (e *FeedbackEvent) ValidateAt(now time.Time) error {
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
	if err := checkID("request_id", e.RequestID, false); err != nil {
		return err
	}
	if err := checkID("conversation_id", e.ConversationID, false); err != nil {
		return err
	}
	if e.RequestID == "" && e.ConversationID == "" {
		return fieldErr("request_id", ErrMissingField, "a feedback event rates a request_id, a conversation_id or both")
	}
	if err := checkFeedbackName("name", e.Name); err != nil {
		return err
	}
	if err := checkFeedbackValue("value", e.Value); err != nil {
		return err
	}
	switch e.Source {
	case SourceUser, SourceEvaluator, SourceHeuristic:
	case "":
		return fieldErr("source", ErrMissingField, "")
	default:
		return fieldErr("source", ErrUnknownStatus, quoteBounded(string(e.Source)))
	}
	for _, l := range [...]struct{ name, v string }{{"scene", e.Scene}, {"env", e.Env}, {"model", e.Model}} {
		if err := checkLabel(l.name, l.v, false); err != nil {
			return err
		}
	}
	switch {
	case e.CommentLength < 0:
		return fieldErr("comment_length", ErrNegative, strconv.Itoa(e.CommentLength))
	case e.CommentLength > MaxCommentLength:
		return fieldErr("comment_length", ErrOutOfRange, "over "+strconv.Itoa(MaxCommentLength))
	}
	return nil
}

// checkFeedbackName keeps names few and printable: they become columns of a rollup key and
// metric labels, so they are short identifiers, never text. field is the field the error
// names: name of a feedback event, scores of a request event.
func checkFeedbackName(field, name string) error {
	if name == "" {
		return fieldErr(field, ErrMissingField, "a name is empty")
	}
	if len(name) > MaxFeedbackNameLen {
		return fieldErr(field, ErrTooLong, quoteBounded(name)+" is over "+strconv.Itoa(MaxFeedbackNameLen)+" bytes")
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-', c == '.':
		default:
			return fieldErr(field, ErrOutOfRange, quoteBounded(name)+" is not letters, digits, '_', '-' or '.'")
		}
	}
	return nil
}

func checkFeedbackValue(field string, v float64) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fieldErr(field, ErrOutOfRange, "not a finite number")
	case math.Abs(v) > MaxFeedbackValue:
		return fieldErr(field, ErrOutOfRange, formatMs(v)+" is beyond ±1e9")
	}
	return nil
}

// AppendFeedback appends ev as the contract's JSON to dst, as AppendRequest does for
// request events.
func AppendFeedback(dst []byte, ev *FeedbackEvent) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(ev.V), 10)
	dst = appendStrField(dst, "event_id", ev.EventID)
	dst = append(dst, `,"ts":"`...)
	dst = AppendTime(dst, ev.TS)
	dst = append(dst, '"')
	dst = appendOptStr(dst, "request_id", ev.RequestID)
	dst = appendOptStr(dst, "conversation_id", ev.ConversationID)
	dst = appendStrField(dst, "name", ev.Name)
	dst = appendFloatField(dst, "value", ev.Value)
	dst = appendStrField(dst, "source", string(ev.Source))
	dst = appendOptStr(dst, "scene", ev.Scene)
	dst = appendOptStr(dst, "env", ev.Env)
	dst = appendOptStr(dst, "model", ev.Model)
	if ev.CommentLength != 0 {
		dst = appendIntField(dst, "comment_length", int64(ev.CommentLength))
	}
	return append(dst, '}')
}

// Positive reports whether a value counts as positive in the feedback rollups' share
// positive: above zero, so thumbs up (1) against down (0 or −1), a task completed (1)
// against not (0). On a rating scale every rating is above zero; there the rollups' digest
// of values, or SQL on the raw value (rating >= 4), tells satisfied from not.
func Positive(v float64) bool { return v > 0 }
