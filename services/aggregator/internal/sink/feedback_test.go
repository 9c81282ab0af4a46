package sink

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestRecentFeedbackIDs: the ids read back at start are the latest at or before the
// position given (the floor), newest first, and this consumer's only.
func TestRecentFeedbackIDs(t *testing.T) {
	db, _ := openDB(t)
	ctx := context.Background()
	ts := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	var rows []Feedback
	for seq := uint64(1); seq <= 6; seq++ {
		rows = append(rows, Feedback{Seq: seq, Event: events.FeedbackEvent{V: 1, EventID: "f" + string(rune('0'+seq)), TS: ts,
			RequestID: "r", Name: "thumbs", Value: 1, Source: events.SourceUser}})
	}
	if err := New(db.Conn(), "agg").WriteFeedback(ctx, rows); err != nil {
		t.Fatal(err)
	}
	if err := New(db.Conn(), "other").WriteFeedback(ctx, rows[:1]); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	var ids []string
	if err := New(db.Conn(), "agg").RecentFeedbackIDs(ctx, 3, 4, func(ev *events.FeedbackEvent, seq uint64) {
		got = append(got, seq)
		ids = append(ids, ev.EventID)
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []uint64{4, 3, 2}) || !slices.Equal(ids, []string{"f4", "f3", "f2"}) {
		t.Fatalf("read %v %v, want positions 4, 3, 2", got, ids)
	}
}
