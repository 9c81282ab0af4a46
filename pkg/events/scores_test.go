package events_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// withScores is sampleEvent's JSON with a scores field set to raw.
func withScores(t *testing.T, raw string) []byte {
	t.Helper()
	ev := sampleEvent()
	data := events.AppendRequest(nil, &ev)
	return append(append(data[:len(data)-1], `,"scores":`...), raw+"}"...)
}

func TestDecodeScores(t *testing.T) {
	many := make([]string, events.MaxScores+1)
	for i := range many {
		many[i] = `"s` + string(rune('a'+i)) + `":1`
	}
	for _, tc := range []struct {
		name      string
		scores    string
		want      []events.Score
		wantErr   error  // from decoding or validation
		wantField string // the field the error names
		wantInErr string // a part of the error's text
	}{
		{name: "numbers and booleans", scores: `{"quality":0.82,"task_completed":true,"thumbs":false}`,
			want: []events.Score{{"quality", 0.82}, {"task_completed", 1}, {"thumbs", 0}}},
		{name: "spaced", scores: ` { "rating" : 4 , "x.y-z_1" : -1e3 } `, want: []events.Score{{"rating", 4}, {"x.y-z_1", -1000}}},
		{name: "empty object", scores: `{}`},
		{name: "null", scores: `null`},
		{name: "repeated name, last wins", scores: `{"rating":2,"thumbs":1,"rating":5}`, want: []events.Score{{"rating", 5}, {"thumbs", 1}}},
		{name: "escaped name", scores: `{"q\u0075ality":1}`, want: []events.Score{{"quality", 1}}},
		{name: "exactly the bound", scores: "{" + strings.Join(many[:events.MaxScores], ",") + "}", want: func() []events.Score {
			s := make([]events.Score, events.MaxScores)
			for i := range s {
				s[i] = events.Score{Name: "s" + string(rune('a'+i)), Value: 1}
			}
			return s
		}()},
		{name: "over the bound", scores: "{" + strings.Join(many, ",") + "}", wantErr: events.ErrOutOfRange, wantField: "scores", wantInErr: "more than 16"},
		{name: "not an object", scores: `[1]`, wantErr: events.ErrWrongType, wantField: "scores"},
		{name: "string value", scores: `{"quality":"good"}`, wantErr: events.ErrWrongType, wantField: "scores", wantInErr: `"quality"`},
		{name: "null value", scores: `{"quality":null}`, wantErr: events.ErrWrongType, wantField: "scores", wantInErr: `"quality"`},
		{name: "bad name", scores: `{"has space":1}`, wantErr: events.ErrOutOfRange, wantField: "scores", wantInErr: `"has space"`},
		{name: "empty name", scores: `{"":1}`, wantErr: events.ErrMissingField, wantField: "scores"},
		{name: "long name", scores: `{"` + strings.Repeat("x", 65) + `":1}`, wantErr: events.ErrTooLong, wantField: "scores"},
		{name: "value too big", scores: `{"quality":2e9}`, wantErr: events.ErrOutOfRange, wantField: "scores.quality"},
		{name: "value beyond a float64", scores: `{"quality":1e400}`, wantErr: events.ErrOutOfRange, wantField: "scores.quality"},
		{name: "bad number", scores: `{"quality":1.}`, wantErr: events.ErrMalformed},
		{name: "unterminated", scores: `{"quality":1`, wantErr: events.ErrMalformed},
		{name: "missing colon", scores: `{"quality" 1}`, wantErr: events.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := withScores(t, tc.scores)
			dec := events.NewDecoder(64)
			for _, decode := range []func([]byte, *events.RequestEvent) error{events.UnmarshalRequest, dec.Decode} {
				var ev events.RequestEvent
				err := decode(data, &ev)
				if err == nil {
					err = ev.ValidateAt(testNow)
				}
				if !errors.Is(err, tc.wantErr) || (err != nil && !errors.Is(err, events.ErrInvalidEvent)) {
					t.Fatalf("%s: got error %v, want %v", data, err, tc.wantErr)
				}
				if err != nil {
					var fe *events.FieldError
					if tc.wantField != "" && (!errors.As(err, &fe) || fe.Field != tc.wantField) {
						t.Fatalf("error %v does not name field %s", err, tc.wantField)
					}
					if !strings.Contains(err.Error(), tc.wantInErr) {
						t.Fatalf("error %v does not say %s", err, tc.wantInErr)
					}
					continue
				}
				if !reflect.DeepEqual(ev.Scores, tc.want) {
					t.Fatalf("scores %+v, want %+v", ev.Scores, tc.want)
				}
			}
		})
	}
}

func TestValidateScores(t *testing.T) {
	for _, tc := range []struct {
		name    string
		scores  []events.Score
		wantErr error
	}{
		{name: "fine", scores: []events.Score{{"quality", 0.5}, {"thumbs", 1}}},
		{name: "twice", scores: []events.Score{{"quality", 0.5}, {"quality", 1}}, wantErr: events.ErrOutOfRange},
		{name: "not finite", scores: []events.Score{{"quality", math.NaN()}}, wantErr: events.ErrOutOfRange},
		{name: "too many", scores: make([]events.Score, events.MaxScores+1), wantErr: events.ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev := sampleEvent()
			ev.Scores = tc.scores
			if err := ev.ValidateAt(testNow); !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
		})
	}
}

// TestScoresRoundTrip checks that the encoder writes scores as the decoder reads them and as
// encoding/json reads the object, and that an event without scores writes no scores field.
func TestScoresRoundTrip(t *testing.T) {
	ev := sampleEvent()
	ev.Scores = []events.Score{{"quality", 0.82}, {"task_completed", 1}}
	data := events.AppendRequest(nil, &ev)
	var got events.RequestEvent
	if err := events.UnmarshalRequest(data, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ev) {
		t.Fatalf("round trip of %s:\n got %+v\nwant %+v", data, got, ev)
	}
	var generic struct {
		Scores map[string]float64 `json:"scores"`
	}
	if err := json.Unmarshal(data, &generic); err != nil || generic.Scores["quality"] != 0.82 || generic.Scores["task_completed"] != 1 {
		t.Fatalf("encoding/json reads %s as %v (%v)", data, generic.Scores, err)
	}
	ev.Scores = nil
	if data := events.AppendRequest(nil, &ev); strings.Contains(string(data), "scores") {
		t.Fatalf("no scores, yet %s", data)
	}
}

// TestDecoderScoresAllocateOnce bounds what an event with scores costs the interning
// decoder: the one slice that holds them.
func TestDecoderScoresAllocateOnce(t *testing.T) {
	ev := sampleEvent()
	ev.Scores = []events.Score{{"quality", 0.82}, {"task_completed", 1}, {"rating", 4}}
	data := events.AppendRequest(nil, &ev)
	dec := events.NewDecoder(64)
	var got events.RequestEvent
	if n := testing.AllocsPerRun(100, func() {
		if err := dec.Decode(data, &got); err != nil {
			t.Fatal(err)
		}
		if err := got.ValidateAt(testNow); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Fatalf("Decode+ValidateAt of an event with scores allocates %v times, want 1", n)
	}
}

// TestScoreErrorBoundsTheName: a score whose number cannot be read is named in the error
// only by a name that passes the rules; any other is quoted, bounded, as every value from a
// client is, so a huge or binary name cannot make the answer or the dead letter carry it.
func TestScoreErrorBoundsTheName(t *testing.T) {
	name := strings.Repeat("x", 100_000) + `\n\u001b[31m`
	data := withScores(t, `{"`+name+`":1e400}`)
	dec := events.NewDecoder(64)
	for _, decode := range []func([]byte, *events.RequestEvent) error{events.UnmarshalRequest, dec.Decode} {
		var ev events.RequestEvent
		err := decode(data, &ev)
		if !errors.Is(err, events.ErrOutOfRange) {
			t.Fatalf("got error %v, want %v", err, events.ErrOutOfRange)
		}
		if msg := err.Error(); len(msg) > 512 || strings.ContainsAny(msg, "\n\x1b") {
			t.Fatalf("error of %d bytes, or with a control character: %.200q", len(msg), msg)
		}
	}
}
