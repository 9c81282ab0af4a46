package pipeline

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// TestFeedbackExactlyOnceAcrossRestarts runs random feedback, verdicts sent again and ids
// reused among it, some late and some hours late, through the feedback stage with flushes at
// random, once without a crash and once with crashes at random and restarts from the floor,
// the ledgers and the dedup memory read back as NewFeedback reads them: the same verdicts
// are stored and counted, each once.
func TestFeedbackExactlyOnceAcrossRestarts(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for iter := range 1500 {
		r := rand.New(rand.NewPCG(uint64(iter), 3))
		cfg := window.Config{Window: 15 * time.Second, Lateness: 30 * time.Second, Buckets: events.DefaultBucketBounds(), MaxSeries: 100}
		dedup := 1 + r.IntN(20)
		type msg struct {
			data []byte
			when time.Duration
		}
		var msgs []msg
		clock := time.Duration(0)
		for range 100 + r.IntN(200) {
			clock += time.Duration(r.IntN(1500)) * time.Millisecond
			id := fmt.Sprint("id", r.IntN(40))
			val := float64(r.IntN(2))
			at := clock - time.Duration(r.IntN(2000))*time.Millisecond
			if r.IntN(15) == 0 {
				at -= time.Duration(r.IntN(3)) * time.Hour
			}
			ev := events.FeedbackEvent{V: 1, EventID: id, TS: t0.Add(at), RequestID: "r" + id, Name: "thumbs", Value: val, Source: events.SourceUser}
			msgs = append(msgs, msg{events.AppendFeedback(nil, &ev), clock})
		}
		run := func(crashes int) (raw []uint64, counted uint64) {
			type rrow struct {
				seq uint64
				ev  events.FeedbackEvent
			}
			var raws []rrow
			type roll struct {
				start   time.Time
				through uint64
				n       uint64
			}
			var rolls []roll
			var floor uint64
			delay := time.Duration(0)
			for proc := 0; ; proc++ {
				done := map[time.Time]uint64{}
				for _, x := range rolls {
					if x.through > floor {
						done[x.start] = max(done[x.start], x.through)
					}
				}
				var stored storedSet
				for _, x := range raws {
					if x.seq > floor {
						stored.seqs = append(stored.seqs, x.seq)
					}
				}
				slices.Sort(stored.seqs)
				// The feedback table, as sink.ClickHouse.RecentFeedbackIDs reads it.
				read := func(_ context.Context, n int, through uint64, f func(ev *events.FeedbackEvent, seq uint64)) error {
					rows := slices.Clone(raws)
					slices.SortFunc(rows, func(a, b rrow) int { return cmp.Compare(b.seq, a.seq) })
					for _, x := range rows {
						if n == 0 {
							break
						}
						if x.seq <= through {
							f(&x.ev, x.seq)
							n--
						}
					}
					return nil
				}
				ids := newRecentIDs(dedup)
				if err := ids.load(context.Background(), read, floor); err != nil {
					t.Fatal(err)
				}
				s := &feedbackStage{agg: window.NewFeedback(cfg, done), dec: events.NewDecoder(4096), cfg: cfg, stored: stored, ids: ids}
				last := floor
				crashAt := uint64(len(msgs))
				if proc < crashes {
					crashAt = floor + uint64(r.IntN(len(msgs)-int(floor)+1))
				}
				flush := func(now time.Time) {
					f := s.cut(now, last).(*feedbackFlush)
					for _, x := range f.raw {
						raws = append(raws, rrow{x.Seq, x.Event})
					}
					for _, x := range f.rollups {
						rolls = append(rolls, roll{x.WindowStart, last, x.Count})
					}
					s.agg.Flushed(f.starts, last, now)
					if m, ok := s.held(); ok {
						floor = max(floor, m-1)
					} else {
						floor = max(floor, last)
					}
				}
				for seq := floor + 1; seq <= uint64(len(msgs)); seq++ {
					now := t0.Add(msgs[seq-1].when + delay)
					s.handle(msgs[seq-1].data, seq, now, t0.Add(msgs[seq-1].when))
					last = seq
					if r.IntN(10) == 0 {
						flush(now)
					}
					if seq >= crashAt && proc < crashes {
						break
					}
				}
				if proc >= crashes {
					flush(t0.Add(clock + delay + 10*time.Hour))
					break
				}
				delay += time.Duration(r.IntN(300)) * time.Second
			}
			for _, x := range raws {
				raw = append(raw, x.seq)
			}
			slices.Sort(raw)
			for _, x := range rolls {
				counted += x.n
			}
			return raw, counted
		}
		state := *r
		wantRaw, want := run(0)
		*r = state
		gotRaw, got := run(1 + r.IntN(3))
		if got != want || !slices.Equal(gotRaw, wantRaw) || uint64(len(gotRaw)) != got {
			t.Fatalf("iter %d (dedup %d): counted %d, raw %v; without crashes %d, raw %v", iter, dedup, got, gotRaw, want, wantRaw)
		}
	}
}
