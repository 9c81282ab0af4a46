package pipeline

import (
	"math"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestRecentIDs checks the dedup memory: the first position of an id stands, a replay of
// that position is not a duplicate, and past its size the oldest id is forgotten first.
func TestRecentIDs(t *testing.T) {
	r := newRecentIDs(3)
	h := func(id string) uint64 { return r.hash(id) }
	add := func(id string, seq uint64) uint64 { return r.add(h(id), 7, seq).seq }
	if first := add("a", 10); first != 10 {
		t.Fatalf("first of a new id: %d", first)
	}
	if first := add("a", 12); first != 10 {
		t.Fatalf("a again at 12: first %d, want 10 (a duplicate)", first)
	}
	if first := add("a", 10); first != 10 {
		t.Fatalf("a replayed at 10: first %d, want 10 (not a duplicate)", first)
	}
	add("b", 13)
	add("c", 14)
	add("d", 15) // forgets a
	if r.len() != 3 {
		t.Fatalf("%d ids remembered, want 3", r.len())
	}
	if first := add("a", 16); first != 16 {
		t.Fatalf("a after it was forgotten: first %d, want 16", first)
	}
	if first := add("c", 17); first != 14 {
		t.Fatalf("c: first %d, want 14", first)
	}
	if first := r.add(h("c"), 8, 18); first.verdict != 7 {
		t.Fatalf("c with another verdict: the first's verdict %d, want 7", first.verdict)
	}
	off := newRecentIDs(0)
	off.add(off.hash("x"), 1, 1)
	if first := off.add(off.hash("x"), 1, 2); first.seq != 2 {
		t.Fatalf("with no memory every id is new: first %d", first.seq)
	}
}

// TestVerdictHash checks what makes two messages of one event_id the same verdict: what
// they rate, name, source and value; not the labels, the time or the comment's length.
func TestVerdictHash(t *testing.T) {
	r := newRecentIDs(1)
	base := events.FeedbackEvent{EventID: "f", RequestID: "r", ConversationID: "c", Name: "thumbs", Value: 1, Source: events.SourceUser}
	same := func(name string, change func(e *events.FeedbackEvent), want bool) {
		t.Helper()
		e := base
		change(&e)
		if got := r.verdict(&e) == r.verdict(&base); got != want {
			t.Errorf("%s: same verdict %v, want %v", name, got, want)
		}
	}
	same("labels, time and comment", func(e *events.FeedbackEvent) { e.Env, e.Scene, e.Model, e.CommentLength = "prod", "chat", "m", 12 }, true)
	same("value", func(e *events.FeedbackEvent) { e.Value = 0 }, false)
	same("request", func(e *events.FeedbackEvent) { e.RequestID = "r2" }, false)
	same("conversation", func(e *events.FeedbackEvent) { e.ConversationID = "c2" }, false)
	same("request and conversation run together", func(e *events.FeedbackEvent) { e.RequestID, e.ConversationID = "rc", "" }, false)
	same("name", func(e *events.FeedbackEvent) { e.Name = "rating" }, false)
	same("source", func(e *events.FeedbackEvent) { e.Source = events.SourceEvaluator }, false)
	zero := base
	zero.Value = 0
	neg := zero
	neg.Value = math.Copysign(0, -1)
	if r.verdict(&zero) != r.verdict(&neg) {
		t.Error("0 and -0 are other verdicts")
	}
}
