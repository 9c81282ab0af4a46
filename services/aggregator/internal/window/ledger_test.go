package window_test

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// TestLedgerKeptThroughReplay: a late event of an old window, stored in a correction
// before a restart, comes again in the replay after the current events beside it. The
// first flush of the replay must not forget the old window's ledger entry before the
// replay reaches the event, or it is counted twice.
func TestLedgerKeptThroughReplay(t *testing.T) {
	old := t0.Add(-3 * time.Hour)
	// Before the restart: events 1..49 and 51..60 at t0, event 50 three hours late; the
	// correction of its window was stored with the flush cut at 60.
	a := window.New(cfg(t), map[time.Time]uint64{old: 60})
	now := t0.Add(time.Minute)
	for seq := uint64(1); seq < 50; seq++ {
		if r := a.Add(ev(0, events.StatusOK, 1, 2, 1, 2), seq, now); r != window.Added {
			t.Fatalf("event %d: %v", seq, r)
		}
	}
	// A flush during the replay: the window at t0 closes and is stored.
	units := a.Advance(now)
	starts := make([]time.Time, 0, len(units))
	for _, u := range units {
		starts = append(starts, u.Start)
		a.Release(u)
	}
	a.Flushed(starts, 49, now)
	e := ev(-3*time.Hour, events.StatusOK, 1, 2, 1, 2)
	if r := a.Add(e, 50, now); r != window.Skipped {
		t.Fatalf("the late event stored before the restart: %v, want skipped (counted twice)", r)
	}
}

// TestLedgerOfAnotherLengthKeptThroughReplay: as TestLedgerKeptThroughReplay, for a
// correction stored with another AGG_WINDOW.
func TestLedgerOfAnotherLengthKeptThroughReplay(t *testing.T) {
	old := t0.Add(-3 * time.Hour)
	a := window.New(cfg(t), nil)
	a.Stored(5*time.Second, map[time.Time]uint64{old: 60})
	now := t0.Add(time.Minute)
	for seq := uint64(1); seq < 50; seq++ {
		a.Add(ev(0, events.StatusOK, 1, 2, 1, 2), seq, now)
	}
	for _, u := range a.Advance(now) {
		a.Release(u)
	}
	a.Flushed([]time.Time{t0}, 49, now)
	if r := a.Add(ev(-3*time.Hour, events.StatusOK, 1, 2, 1, 2), 50, now); r != window.Skipped {
		t.Fatalf("the late event stored before the restart: %v, want skipped (counted twice)", r)
	}
}
