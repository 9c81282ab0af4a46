package events_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

func TestUnmarshalFeedback(t *testing.T) {
	const head = `"v":1,"event_id":"f1","ts":"2026-11-30T10:00:00Z","request_id":"r1","source":"user"`
	tests := []struct {
		name    string
		in      string
		want    events.FeedbackEvent
		wantErr error
		field   string
	}{
		{name: "true is 1", in: `{` + head + `,"name":"thumbs","value":true}`, want: events.FeedbackEvent{Name: "thumbs", Value: 1}},
		{name: "false is 0", in: `{` + head + `,"name":"thumbs","value":false}`, want: events.FeedbackEvent{Name: "thumbs", Value: 0}},
		{name: "number", in: `{` + head + `,"name":"rating","value":4.5}`, want: events.FeedbackEvent{Name: "rating", Value: 4.5}},
		{name: "a key given twice", in: `{` + head + `,"name":"a","value":1,"name":"thumbs","value":-1}`, wantErr: events.ErrMalformed},
		{name: "keys match exactly", in: `{` + head + `,"name":"thumbs","Value":1}`, wantErr: events.ErrMalformed},
		{name: "comment kept as its length only", in: `{` + head + `,"name":"thumbs","value":1,"comment":"héllo"}`, want: events.FeedbackEvent{Name: "thumbs", Value: 1, CommentLength: 5}},
		{name: "value string", in: `{` + head + `,"name":"thumbs","value":"1"}`, wantErr: events.ErrWrongType, field: "value"},
		{name: "value object", in: `{` + head + `,"name":"thumbs","value":{"a":1}}`, wantErr: events.ErrWrongType, field: "value"},
		{name: "name not a string", in: `{` + head + `,"name":7,"value":1}`, wantErr: events.ErrWrongType, field: "name"},
		{name: "no name", in: `{` + head + `,"value":1}`, wantErr: events.ErrMissingField, field: "name"},
		{name: "null value is absent", in: `{` + head + `,"name":"thumbs","value":null}`, wantErr: events.ErrMissingField, field: "value"},
		{name: "trailing data", in: `{` + head + `,"name":"thumbs","value":1} {}`, wantErr: events.ErrMalformed},
		{name: "deep unknown field", in: `{` + head + `,"name":"thumbs","value":1,"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, wantErr: events.ErrMalformed},
		{name: "not an object", in: `[1]`, wantErr: events.ErrMalformed},
	}
	dec := events.NewDecoder(8)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, decode := range []func([]byte, *events.FeedbackEvent) error{events.UnmarshalFeedback, dec.DecodeFeedback} {
				var ev events.FeedbackEvent
				err := decode([]byte(tt.in), &ev)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("error %v, want %v", err, tt.wantErr)
				}
				if err != nil {
					if !errors.Is(err, events.ErrInvalidEvent) {
						t.Fatalf("%v does not wrap ErrInvalidEvent", err)
					}
					if fe, ok := errors.AsType[*events.FieldError](err); tt.field != "" && (!ok || fe.Field != tt.field) {
						t.Fatalf("error %v does not name field %s", err, tt.field)
					}
					continue
				}
				if ev.Name != tt.want.Name || ev.Value != tt.want.Value || ev.CommentLength != tt.want.CommentLength {
					t.Fatalf("got name=%q value=%v comment_length=%d, want %q %v %d", ev.Name, ev.Value, ev.CommentLength, tt.want.Name, tt.want.Value, tt.want.CommentLength)
				}
				if err := ev.ValidateAt(testNow); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestValidateFeedbackNamesTheField(t *testing.T) {
	base := events.FeedbackEvent{V: 1, EventID: "f", TS: testNow, RequestID: "r", Name: "thumbs", Value: 1, Source: events.SourceUser}
	tests := []struct {
		name    string
		edit    func(*events.FeedbackEvent)
		field   string
		wantErr error
	}{
		{"no target", func(e *events.FeedbackEvent) { e.RequestID = "" }, "request_id", events.ErrMissingField},
		{"conversation only is enough", func(e *events.FeedbackEvent) { e.RequestID, e.ConversationID = "", "c" }, "", nil},
		{"long request id", func(e *events.FeedbackEvent) { e.RequestID = strings.Repeat("r", 129) }, "request_id", events.ErrTooLong},
		{"name with spaces", func(e *events.FeedbackEvent) { e.Name = "thumbs up" }, "name", events.ErrOutOfRange},
		{"bad utf-8 scene", func(e *events.FeedbackEvent) { e.Scene = "\xff" }, "scene", events.ErrNotUTF8},
		{"future", func(e *events.FeedbackEvent) { e.TS = testNow.Add(time.Hour) }, "ts", events.ErrFutureTimestamp},
		{"huge comment", func(e *events.FeedbackEvent) { e.CommentLength = events.MaxCommentLength + 1 }, "comment_length", events.ErrOutOfRange},
		{"evaluator", func(e *events.FeedbackEvent) { e.Source = events.SourceEvaluator }, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := base
			tt.edit(&ev)
			err := ev.ValidateAt(testNow)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if fe, ok := errors.AsType[*events.FieldError](err); err != nil && (!ok || fe.Field != tt.field) {
				t.Fatalf("error %v does not name field %s", err, tt.field)
			}
		})
	}
}

// TestAppendFeedbackRoundTrip checks the encoder writes what the decoder reads back and the
// schema accepts.
func TestAppendFeedbackRoundTrip(t *testing.T) {
	sch := compileSchema(t, "feedback_event.schema.json")
	files, _ := filepath.Glob(filepath.Join("testdata", "feedback", "valid", "*.json"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var a, b events.FeedbackEvent
		if err := events.UnmarshalFeedback(raw, &a); err != nil {
			t.Fatal(err)
		}
		out := events.AppendFeedback(nil, &a)
		if err := validateSchema(sch, out); err != nil {
			t.Fatalf("%s: encoded %s fails the schema: %v", f, out, err)
		}
		if err := events.UnmarshalFeedback(out, &b); err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("%s: round trip changed %+v into %+v", f, a, b)
		}
	}
}

func FuzzUnmarshalFeedback(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "feedback", "*", "*.json"))
	for _, s := range seeds {
		raw, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var a, b events.FeedbackEvent
		errA := events.UnmarshalFeedback(data, &a)
		if errA != nil && !errors.Is(errA, events.ErrInvalidEvent) {
			t.Fatalf("%v does not wrap ErrInvalidEvent", errA)
		}
		if errA != nil || a.ValidateAt(testNow) != nil {
			return
		}
		if err := events.UnmarshalFeedback(events.AppendFeedback(nil, &a), &b); err != nil || a != b {
			t.Fatalf("round trip of %q: %v, %+v != %+v", data, err, a, b)
		}
	})
}

func ExampleAppendFeedback() {
	ev := events.FeedbackEvent{V: events.Version, EventID: "fb-1", TS: time.Date(2026, 11, 30, 10, 5, 0, 0, time.UTC),
		RequestID: "0192f5c8-7a3e", Name: "thumbs", Value: 1, Source: events.SourceUser}
	os.Stdout.Write(events.AppendFeedback(nil, &ev))
	os.Stdout.WriteString("\n" + events.FeedbackSubject("prod", "customer.service") + "\n")
	// Output:
	// {"v":1,"event_id":"fb-1","ts":"2026-11-30T10:05:00.000Z","request_id":"0192f5c8-7a3e","name":"thumbs","value":1,"source":"user"}
	// llm.feedback.prod.customer_service
}
