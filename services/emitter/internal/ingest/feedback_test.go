package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

func feedback(id string) string {
	return `{"v":1,"event_id":"` + id + `","ts":"2026-03-01T11:59:00.000Z","request_id":"req-` + id + `","name":"thumbs","value":1,"source":"user","scene":"chat","env":"prod"}`
}

func newFeedbackHandler(pub Publisher, opts Options, reg prometheus.Registerer) *Handler {
	if opts.MaxBytes == 0 {
		opts.MaxBytes = 1 << 20
	}
	return NewFeedback(opts, pub, func() time.Time { return now }, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// TestFeedbackBadItemsBesideGood sends every kind of bad item among good ones: each bad one
// has its index and a reason naming the field, and every good one is published.
func TestFeedbackBadItemsBesideGood(t *testing.T) {
	bad := []struct{ body, want string }{
		{`{"v":1,"event_id":"b1","ts":"2026-03-01T11:59:00Z","name":"thumbs","value":1,"source":"user"}`, "request_id: missing required field"},
		{`{"v":1,"event_id":"b2","ts":"2026-03-01T11:59:00Z","request_id":"r","name":"thumbs","value":"yes","source":"user"}`, "value: wrong JSON type"},
		{`{"v":1,"event_id":"b3","ts":"2026-03-01T11:59:00Z","request_id":"r","name":"no spaces please","value":1,"source":"user"}`, "name: value out of range"},
		{`{"v":1,"event_id":"b4","ts":"2026-03-01T11:59:00Z","request_id":"r","name":"thumbs","value":1,"source":"bot"}`, "source: unknown value"},
		{`{"v":1,"event_id":"b5","ts":"2026-03-01T11:59:00Z","request_id":"r","name":"thumbs","value":1e10,"source":"user"}`, "value: value out of range"},
		{`{"v":1,"event_id":"b6","ts":"2026-03-01T11:59:00Z","request_id":"r","name":"thumbs","value":1,"source":"user"`, "malformed JSON"},
		{`{"v":1,"event_id":"b7","ts":"2026-03-01T13:59:00Z","request_id":"r","name":"thumbs","value":1,"source":"user"}`, "ts: timestamp too far in the future"},
		{`{"v":1,"event_id":"b8","ts":"2026-03-01T11:59:00Z","request_id":"r","name":"thumbs","source":"user"}`, "value: missing required field"},
	}
	for _, array := range []bool{false, true} {
		var items []string
		want := map[int]string{}
		for i, b := range bad {
			if array && strings.HasSuffix(b.body, `"user"`) {
				continue // an array must be JSON as a whole: no malformed item in it
			}
			items = append(items, feedback(fmt.Sprint("g", i)), b.body)
			want[len(items)-1] = b.want
		}
		body := strings.Join(items, "\n")
		if array {
			body = "[" + strings.Join(items, ",") + "]"
		}
		reg := prometheus.NewRegistry()
		pub := &memPub{}
		h := newFeedbackHandler(pub, Options{}, reg)
		code, a := post(h, body)
		if code != http.StatusAccepted || a.Accepted != len(want) || a.Rejected != len(want) || len(a.Errors) != len(want) {
			t.Fatalf("array=%v: %d %+v", array, code, a)
		}
		for _, e := range a.Errors {
			if w, ok := want[e.Index]; !ok || !strings.Contains(e.Error, w) {
				t.Fatalf("array=%v: item %d: %q, want %q", array, e.Index, e.Error, w)
			}
		}
		for i, m := range pub.msgs {
			if !strings.HasPrefix(m, "llm.feedback.prod.chat g") {
				t.Fatalf("published %q", m)
			}
			var fb events.FeedbackEvent
			if err := events.UnmarshalFeedback(pub.data[i], &fb); err != nil || fb.ValidateAt(now) != nil {
				t.Fatalf("published %s: %v", pub.data[i], err)
			}
		}
		if n := testutil.ToFloat64(h.accepted); n != float64(len(want)) {
			t.Fatalf("accepted counted %v", n)
		}
	}
}

// TestFeedbackPayloadAndSubject checks the stream holds the canonical form, with no comment
// text, on a subject whose unknown labels are "_".
func TestFeedbackPayloadAndSubject(t *testing.T) {
	pub := &memPub{}
	body := `{"ts":"2026-03-01T12:59:00.000+01:00","v":1,"event_id":"f1","conversation_id":"c1","name":"rating","value":4,"source":"user","comment":"secret words"}`
	if code, a := post(newFeedbackHandler(pub, Options{}, nil), body); code != 202 || a.Accepted != 1 {
		t.Fatalf("%d %+v", code, a)
	}
	want := `{"v":1,"event_id":"f1","ts":"2026-03-01T11:59:00.000Z","conversation_id":"c1","name":"rating","value":4,"source":"user","comment_length":12}`
	if pub.msgs[0] != "llm.feedback._._ f1" || string(pub.data[0]) != want {
		t.Fatalf("published %q %s, want %s", pub.msgs[0], pub.data[0], want)
	}
}

// TestFeedbackSharesTheSubjectBound checks feedback folds into other like request events
// once the env × scene subjects are used up.
func TestFeedbackSharesTheSubjectBound(t *testing.T) {
	pub := &memPub{}
	lim := subject.New(2, time.Hour, nil)
	h := newFeedbackHandler(pub, Options{Subjects: lim}, nil)
	var sb strings.Builder
	for i := range 5 {
		sb.WriteString(strings.Replace(feedback(fmt.Sprint("f", i)), `"chat"`, fmt.Sprintf(`"scene-%d"`, i), 1) + "\n")
	}
	if code, a := post(h, sb.String()); code != 202 || a.Accepted != 5 {
		t.Fatalf("%d %+v", code, a)
	}
	if pub.msgs[0] != "llm.feedback.prod.scene-0 f0" || pub.msgs[4] != "llm.feedback.prod.other f4" {
		t.Fatalf("subjects %q", pub.msgs)
	}
}

func TestFeedbackLimitsAndToken(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newFeedbackHandler(&memPub{}, Options{MaxBytes: 1024, Token: "s3cret"}, reg)
	send := func(body, auth string) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/v1/feedback", strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		h.ServeHTTP(rec, req)
		var a Answer
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
			t.Fatalf("answer %q is not JSON: %v", rec.Body.String(), err)
		}
		return rec.Code
	}
	if got := send(feedback("a"), ""); got != 401 {
		t.Fatalf("no token: %d", got)
	}
	if got := send(strings.Repeat(feedback("a")+"\n", 10), "Bearer s3cret"); got != 413 {
		t.Fatalf("too big: %d", got)
	}
	if got := send(feedback("a"), "Bearer s3cret"); got != 202 {
		t.Fatalf("good: %d", got)
	}
	if got := send(`{"v":1}`, "Bearer s3cret"); got != 400 {
		t.Fatalf("bad only: %d", got)
	}
	if n := testutil.ToFloat64(h.rejected.WithLabelValues("missing_field")); n != 1 {
		t.Fatalf("emitter_feedback_events_rejected_total{reason=missing_field} = %v", n)
	}
	if n := testutil.ToFloat64(h.accepted); n != 1 {
		t.Fatalf("emitter_feedback_events_accepted_total = %v", n)
	}
}

func BenchmarkFeedbackNDJSON(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString(feedback(fmt.Sprint("0192f5c8-7a3e-7c41-9b1a-", i)) + "\n")
	}
	body := []byte(sb.String())
	h := newFeedbackHandler(discard{}, Options{MaxBytes: 64 << 20}, nil)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if r := h.ingest(context.Background(), body, now, nil); r.Accepted != 1000 {
			b.Fatal(r.Answer)
		}
	}
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}
