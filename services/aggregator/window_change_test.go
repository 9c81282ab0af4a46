package main

import (
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestWindowChangeAcrossRestart stops an aggregator holding an open window and starts it
// again with another AGG_WINDOW: the replay judges each event by the stored rows of the
// window length they were written with, so every event is counted once, whichever way the
// length changes.
func TestWindowChangeAcrossRestart(t *testing.T) {
	for _, tc := range []struct{ name, before, after string }{
		{"longer", "5s", "10s"}, // an event of a window left open must not pass for stored
		{"shorter", "10s", "5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t)
			vars := func(window string) envVars {
				return b.env(envVars{"AGG_WINDOW": window, "AGG_LATENESS": "2s", "AGG_FLUSH_INTERVAL": "100ms",
					"AGG_STORE_REQUESTS": "false", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false"})
			}
			ev := func(ts time.Time) events.RequestEvent {
				return events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: ts, Model: "m", Scene: "chat", Env: "prod",
					InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK}
			}
			// base starts a window of either length, ten minutes ago.
			base := time.Now().UTC().Add(-10 * time.Minute).Truncate(10 * time.Second)
			var evs []events.RequestEvent
			var stored, held uint64 // events whose window the first run stores, and holds open
			switch tc.name {
			case "longer":
				// Positions 1-10 in the 5 s window at base+5s, 11-20 in the one at base, then one
				// at base+6.9s whose end (base+7s) closes the window at base only: it is stored
				// with seq_through 21, while the window at base+5s stays open, holding 1-10 and 21.
				for i := range 10 {
					evs = append(evs, ev(base.Add(5*time.Second+time.Duration(i)*time.Millisecond)))
				}
				for i := range 10 {
					evs = append(evs, ev(base.Add(time.Duration(i)*time.Millisecond)))
				}
				evs = append(evs, ev(base.Add(6900*time.Millisecond)))
				stored, held = 10, 11
			case "shorter":
				// Position 1 in the 10 s window at base+10s, 2-21 in the one at base (its second
				// half, a 5 s window of its own), then one at base+11.9s whose end closes the
				// window at base only: stored with seq_through 22, while the window at base+10s
				// stays open, holding 1 and 22.
				evs = append(evs, ev(base.Add(10500*time.Millisecond)))
				for i := range 20 {
					evs = append(evs, ev(base.Add(5*time.Second+time.Duration(i)*100*time.Millisecond)))
				}
				evs = append(evs, ev(base.Add(11900*time.Millisecond)))
				stored, held = 20, 2
			}
			b.publish(t, evs)
			stop := startAggregator(t, vars(tc.before))
			b.waitRows(t, 30*time.Second, stored, "SELECT sum(requests) FROM token_rollups")
			stop()
			if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups"); got != stored {
				t.Fatalf("%d requests stored before the restart, want %d: the open window was written", got, stored)
			}
			// Started again with the other length, it replays from the open window; one event
			// a minute later closes every window.
			startAggregator(t, vars(tc.after))
			b.publish(t, []events.RequestEvent{ev(base.Add(time.Minute))})
			want := stored + held
			b.waitRows(t, 30*time.Second, want, "SELECT sum(requests) FROM token_rollups WHERE window_start < toDateTime("+dt(base.Add(time.Minute))+")")
			time.Sleep(500 * time.Millisecond)
			if got := b.scalar(t, "SELECT sum(requests) FROM token_rollups WHERE window_start < toDateTime("+dt(base.Add(time.Minute))+")"); got != want {
				t.Fatalf("sum(requests) = %d after the restart, want %d", got, want)
			}
		})
	}
}
