package window_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// simRow is a row stored in ClickHouse: a unit's requests, with the ledger's seq_through.
type simRow struct {
	width   time.Duration
	start   time.Time
	through uint64
	n       uint64
}

// TestExactlyOnceAcrossRestarts runs random streams of events (current, late, hours late,
// ahead of the clock) through windows flushed at random, with crashes at random (also
// between a flush's write and its record) and restarts from the floor and the ledger, as
// the pipeline keeps them, with AGG_WINDOW changed across some restarts and the last
// watermark resumed at some: every event must be counted exactly once.
func TestExactlyOnceAcrossRestarts(t *testing.T) {
	for iter := range 2000 {
		r := rand.New(rand.NewPCG(uint64(iter), 7))
		c := cfg(t)
		c.Window = []time.Duration{time.Second, 15 * time.Second, time.Minute}[iter%3]
		c.Lateness = []time.Duration{0, 30 * time.Second, 5 * time.Minute}[iter/3%3]
		n := 50 + r.IntN(400)
		type e struct {
			at   time.Duration
			when time.Duration // clock when it arrives
		}
		evs := make([]e, n)
		clock := time.Duration(0)
		for i := range evs {
			clock += time.Duration(r.IntN(2000)) * time.Millisecond
			at := clock - time.Duration(r.IntN(3000))*time.Millisecond
			switch r.IntN(20) {
			case 0:
				at = clock - time.Duration(r.IntN(5))*time.Hour - time.Duration(r.IntN(100))*time.Second
			case 1:
				at = clock - time.Duration(r.IntN(120))*time.Second
			case 2:
				at = clock + time.Duration(r.IntN(240))*time.Second
			}
			evs[i] = e{at, clock}
		}
		var rows []simRow
		var floor uint64
		var closed time.Time
		done := map[time.Duration]map[time.Time]uint64{}
		changeWidth := iter%2 == 1
		crashes := 1 + r.IntN(3)
		restartDelay := time.Duration(0)
		for proc := 0; ; proc++ {
			if changeWidth && proc > 0 {
				c.Window = []time.Duration{time.Second, 15 * time.Second, time.Minute, 5 * time.Second}[r.IntN(4)]
			}
			a := window.New(c, done[c.Window])
			for w, d := range done {
				if w != c.Window {
					a.Stored(w, d)
				}
			}
			if !closed.IsZero() && r.IntN(2) == 0 {
				a.Resume(closed)
			}
			last := floor
			crashAt := uint64(n)
			if proc < crashes {
				crashAt = floor + uint64(r.IntN(n-int(floor)+1))
			}
			// flush cuts what is closed and stores it; false: the process crashed after the
			// write, before recording it.
			flush := func(now time.Time) bool {
				units := a.Advance(now)
				var starts []time.Time
				for _, u := range units {
					var n uint64
					for _, s := range u.Keys {
						n += s.Requests
					}
					rows = append(rows, simRow{c.Window, u.Start, last, n})
					starts = append(starts, u.Start)
					a.Release(u)
				}
				if proc < crashes && r.IntN(8) == 0 {
					return false
				}
				a.Flushed(starts, last, now)
				if wm := a.Watermark(now); wm.Unix() > 0 {
					e := wm.Add(-c.Lateness).UnixNano()
					if th := time.Unix(0, e/int64(c.Window)*int64(c.Window)).UTC(); th.After(closed) {
						closed = th
					}
				}
				if m, ok := a.Held(); ok {
					floor = max(floor, m-1)
				} else {
					floor = max(floor, last)
				}
				return true
			}
			for seq := floor + 1; seq <= uint64(n); seq++ {
				ev0 := evs[seq-1]
				now := t0.Add(ev0.when + restartDelay)
				x := ev(ev0.at, events.StatusOK, 1, 2, 1, 2)
				a.Add(x, seq, now)
				last = seq
				if r.IntN(10) == 0 && !flush(now) || seq >= crashAt && proc < crashes {
					break
				}
			}
			if proc >= crashes {
				flush(t0.Add(clock + restartDelay + 10*time.Hour))
				if _, ok := a.Held(); ok {
					t.Fatalf("iter %d: still held", iter)
				}
				break
			}
			restartDelay += time.Duration(r.IntN(600)) * time.Second
			done = map[time.Duration]map[time.Time]uint64{}
			for _, row := range rows {
				if row.through > floor {
					if done[row.width] == nil {
						done[row.width] = map[time.Time]uint64{}
					}
					done[row.width][row.start] = max(done[row.width][row.start], row.through)
				}
			}
		}
		var total uint64
		for _, row := range rows {
			total += row.n
		}
		if total != uint64(n) {
			t.Fatalf("iter %d: %d events counted %d times", iter, n, total)
		}
	}
}
