package pipeline

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// NewFeedback returns the pipeline from FEEDBACK to feedback (one row per verdict) and
// feedback_rollups, exactly once as NewTokens. A verdict whose event_id was already counted
// — sent twice past JetStream's duplicate window — is counted as a duplicate and neither
// stored nor rolled up, as long as the id is among the last dedup ids seen (read back from
// ClickHouse at start, so a restart remembers them).
func NewFeedback(ctx context.Context, o Options, cfg window.Config, dedup int, d Deps) (*Pipeline, error) {
	cons, floor, store, err := resetConsumer(ctx, d.JS, o)
	if err != nil {
		return nil, err
	}
	sk := sink.New(d.CH, o.Consumer)
	ob, err := openOutbox(ctx, store, sk)
	if err != nil {
		return nil, err
	}
	var done ledger
	var stored storedSet
	ids := newRecentIDs(dedup)
	err = untilRead(ctx, d.Logger, func() (err error) {
		if err := sk.Settle(ctx, ""); err != nil {
			return err
		}
		if done, err = sk.Done(ctx, "feedback_rollups", floor); err != nil {
			return err
		}
		if err := ob.read(ctx, o.Stream, "feedback_rollups", floor); err != nil {
			return err
		}
		if stored.seqs, err = sk.StoredFeedback(ctx, floor+1, math.MaxUint64); err != nil {
			return err
		}
		return ids.load(ctx, sk.RecentFeedbackIDs, floor)
	})
	if err != nil {
		return nil, err
	}
	if err := checkPositions(ctx, d.JS, o, floor, max(done.maxSeq(), stored.last())); err != nil {
		return nil, err
	}
	m := d.Metrics.forStream("feedback")
	st := &feedbackStage{agg: window.NewFeedback(cfg, done[cfg.Window]), dec: events.NewDecoder(4096), cfg: cfg, sink: sk, stored: stored, ids: ids, m: m}
	done.otherLengths(st.agg, cfg.Window, d.Logger, o.Stream)
	d.Logger.Info("consuming", "stream", o.Stream, "consumer", o.Consumer, "floor", floor, "windows_already_stored", done.windows(),
		"feedback_already_stored", len(stored.seqs), "ids_remembered", ids.len(), "flushes_to_publish_again", ob.flushes)
	return newPipeline(o, d.JS, d.NC, cons, floor, store, ob, st, d.Publisher, m, d.Logger.With("stream", o.Stream)), nil
}

type idSeq struct{ h, verdict, seq uint64 }

// firstSeen is what recentIDs keeps of an id's first event: its stream position and the
// hash of its verdict.
type firstSeen struct{ seq, verdict uint64 }

// recentIDs remembers the stream position and the verdict of the first event of each of
// the last max event_ids, by 64-bit hashes (a false duplicate needs two of a million ids to
// collide: odds of about 1 in 10^7), forgetting the oldest first.
type recentIDs struct {
	seed  maphash.Seed
	first map[uint64]firstSeen
	ring  []uint64
	next  int
	max   int
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{seed: maphash.MakeSeed(), first: make(map[uint64]firstSeen, min(n, 1<<16)), max: n}
}

func (r *recentIDs) hash(id string) uint64 { return maphash.String(r.seed, id) }

// verdict hashes what a verdict says: what it rates, its name, source and value. A message
// sent again says the same; labels and the comment's length may differ without it being
// another verdict.
func (r *recentIDs) verdict(ev *events.FeedbackEvent) uint64 {
	var h maphash.Hash
	h.SetSeed(r.seed)
	for _, s := range [...]string{ev.RequestID, ev.ConversationID, ev.Name, string(ev.Source)} {
		_, _ = h.WriteString(s)
		_ = h.WriteByte(0)
	}
	v := ev.Value
	if v == 0 {
		v = 0 // -0 says what 0 does
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], math.Float64bits(v))
	_, _ = h.Write(b[:])
	return h.Sum64()
}

func (r *recentIDs) len() int { return len(r.first) }

// readRecent calls f with the verdict and stream position of the latest n stored feedback
// events at or before position through, newest first (sink.ClickHouse.RecentFeedbackIDs).
type readRecent func(ctx context.Context, n int, through uint64, f func(ev *events.FeedbackEvent, seq uint64)) error

// load fills r, emptied, with what it held when the pipeline had processed through floor:
// the ids of the last verdicts counted up to it. The replay from the floor then adds the
// later ones in stream order, as they were added the first time, so that each message is
// judged as it was. Filled from the latest verdicts stored, also those after the floor, r
// would have forgotten the oldest ids that these pushed out, and a verdict sent again after
// the floor with one of those ids would be counted a second time.
func (r *recentIDs) load(ctx context.Context, read readRecent, floor uint64) error {
	r.reset()
	var newestFirst []idSeq
	if err := read(ctx, r.max, floor, func(ev *events.FeedbackEvent, seq uint64) {
		newestFirst = append(newestFirst, idSeq{r.hash(ev.EventID), r.verdict(ev), seq})
	}); err != nil {
		return err
	}
	for i := len(newestFirst) - 1; i >= 0; i-- {
		r.add(newestFirst[i].h, newestFirst[i].verdict, newestFirst[i].seq)
	}
	return nil
}

func (r *recentIDs) reset() {
	clear(r.first)
	r.ring, r.next = r.ring[:0], 0
}

// add records seq and verdict as the first of h unless h is known; it returns the first.
func (r *recentIDs) add(h, verdict, seq uint64) firstSeen {
	if first, ok := r.first[h]; ok {
		return first
	}
	if r.max <= 0 {
		return firstSeen{seq, verdict}
	}
	if len(r.ring) < r.max {
		r.ring = append(r.ring, h)
	} else {
		delete(r.first, r.ring[r.next])
		r.ring[r.next] = h
		r.next = (r.next + 1) % r.max
	}
	r.first[h] = firstSeen{seq, verdict}
	return firstSeen{seq, verdict}
}

type feedbackStage struct {
	agg *window.FeedbackAggregator
	dec *events.Decoder
	ev  events.FeedbackEvent
	cfg window.Config

	stored storedSet // feedback stored before the start, after the floor
	ids    *recentIDs
	rows   []sink.Feedback
	rowMin uint64

	sink       *sink.ClickHouse
	m          *metrics
	lastFolded uint64
}

func (s *feedbackStage) handle(data []byte, seq uint64, now, stored time.Time) (result, error) {
	if err := s.dec.DecodeFeedback(data, &s.ev); err != nil {
		return 0, err
	}
	if err := s.ev.ValidateAt(stored); err != nil {
		return 0, err
	}
	// The first position of an id decides, so a replay judges every message as before. A
	// later message with the id is the same verdict sent again, or another verdict under
	// an id already taken (a rating changed and sent with the old id): that one is refused
	// with its reason, never dropped unseen as a copy.
	verdict := s.ids.verdict(&s.ev)
	if first := s.ids.add(s.ids.hash(s.ev.EventID), verdict, seq); first.seq < seq {
		if first.verdict != verdict {
			return 0, events.ReusedEventIDError("an earlier message with it has another value, request_id, conversation_id, name or source: give a changed verdict an event_id of its own")
		}
		return resDuplicate, nil
	}
	res := s.agg.Add(&s.ev, seq, now)
	if !s.stored.has(seq) {
		if len(s.rows) == 0 {
			s.rowMin = seq
		}
		s.rows = append(s.rows, sink.Feedback{Event: cloneFeedback(&s.ev), Seq: seq})
	}
	switch res {
	case window.AddedLate:
		return resLate, nil
	case window.Skipped:
		return resSkipped, nil
	}
	return resAdded, nil
}

// cloneFeedback copies ev's strings out of the message they alias, in one allocation.
func cloneFeedback(ev *events.FeedbackEvent) events.FeedbackEvent {
	c := *ev
	all := strings.Clone(ev.EventID + ev.RequestID + ev.ConversationID + ev.Name + string(ev.Source) + ev.Env + ev.Scene + ev.Model)
	take := func(s string) string {
		v := all[:len(s)]
		all = all[len(s):]
		return v
	}
	c.EventID, c.RequestID, c.ConversationID, c.Name = take(ev.EventID), take(ev.RequestID), take(ev.ConversationID), take(ev.Name)
	c.Source = events.FeedbackSource(take(string(ev.Source)))
	c.Env, c.Scene, c.Model = take(ev.Env), take(ev.Scene), take(ev.Model)
	return c
}

func (s *feedbackStage) held() (uint64, bool) {
	seq, ok := s.agg.Held()
	if len(s.rows) > 0 && (!ok || s.rowMin < seq) {
		return s.rowMin, true
	}
	return seq, ok
}

func (s *feedbackStage) full() bool { return len(s.rows) >= maxBatch }

func (s *feedbackStage) buffered() int {
	_, keys := s.agg.OpenWindows()
	return len(s.rows) + keyWeight*keys
}

func (s *feedbackStage) observe(now time.Time) {
	units, keys := s.agg.OpenWindows()
	s.m.buffered.Set(float64(len(s.rows)))
	s.m.openWindows.Set(float64(units))
	s.m.activeKeys.Set(float64(keys))
	if wm := s.agg.Watermark(now); !wm.IsZero() && wm.Unix() > 0 {
		s.m.watermarkDelay.Set(now.Sub(wm).Seconds())
	}
	if f := s.agg.Folded(); f > s.lastFolded {
		s.m.folded.Add(float64(f - s.lastFolded))
		s.lastFolded = f
	}
}

func (s *feedbackStage) cut(now time.Time, seqThrough uint64) flush {
	f := &feedbackFlush{stage: s, ledger: sink.Ledger{SeqThrough: seqThrough, FlushID: events.NewEventID()}}
	for _, u := range s.agg.Advance(now) {
		f.rollups = s.agg.Rollups(u, f.rollups)
		f.starts = append(f.starts, u.Start)
		s.agg.Release(u)
	}
	f.raw, s.rows = s.rows, nil
	s.stored.passed(seqThrough)
	return f
}

type feedbackFlush struct {
	stage      *feedbackStage
	ledger     sink.Ledger
	rollups    []window.FeedbackRollup
	starts     []time.Time
	raw        []sink.Feedback
	rawWritten bool
	attempt    int
	msgs       []sink.OutboxMsg
}

func (f *feedbackFlush) id() sink.Ledger { return f.ledger }
func (f *feedbackFlush) empty() bool     { return len(f.rollups) == 0 && len(f.raw) == 0 }
func (f *feedbackFlush) count() int      { return len(f.rollups) + len(f.raw) }

func (f *feedbackFlush) write(ctx context.Context, now time.Time) error {
	sk := f.stage.sink
	f.attempt++
	if f.attempt > 1 {
		if err := sk.Settle(ctx, f.ledger.FlushID); err != nil {
			return err
		}
	}
	if len(f.raw) > 0 && !f.rawWritten {
		if f.attempt > 1 {
			// An earlier attempt may have stored part of the batch: write what is missing.
			stored, err := sk.StoredFeedback(ctx, f.raw[0].Seq, f.raw[len(f.raw)-1].Seq)
			if err != nil {
				return err
			}
			set := storedSet{seqs: stored}
			kept := f.raw[:0]
			for _, r := range f.raw {
				if !set.has(r.Seq) {
					kept = append(kept, r)
				}
			}
			f.raw = kept
		}
		if err := sk.WriteFeedback(sk.WithQueryID(ctx, f.ledger.FlushID+"-feedback-"+strconv.Itoa(f.attempt)), f.raw); err != nil {
			return err
		}
		f.rawWritten = true
	}
	if len(f.rollups) == 0 {
		return nil
	}
	if f.attempt > 1 {
		n, err := sk.RowsOfFlush(ctx, "feedback_rollups", f.ledger.FlushID)
		if err != nil {
			return err
		}
		if n == uint64(len(f.rollups)) {
			return nil
		}
	}
	return sk.WriteFeedbackRollups(sk.WithQueryID(ctx, f.ledger.FlushID+"-feedback-rollups-"+strconv.Itoa(f.attempt)), f.rollups, f.ledger, now)
}

// messages are each stored feedback rollup on rollup.feedback.<env>.<scene>, as the token
// rollups are sent, for the alerter's satisfaction rules.
func (f *feedbackFlush) messages() []sink.OutboxMsg {
	if f.msgs == nil {
		f.msgs = encode(f.rollups, f.ledger.FlushID, func(r *window.FeedbackRollup) (string, any) {
			return events.FeedbackRollupSubject(r.Env, r.Scene), FeedbackRollupEvent(r)
		})
	}
	return f.msgs
}

// FeedbackRollupEvent returns the published form of a feedback rollup.
func FeedbackRollupEvent(r *window.FeedbackRollup) *events.FeedbackRollup {
	return &events.FeedbackRollup{
		V: events.Version, WindowStart: r.WindowStart, WindowSeconds: r.WindowSeconds, Kind: r.Kind,
		Env: r.Env, Scene: r.Scene, Model: r.Model, Name: r.Name, Source: r.Source,
		Count: r.Count, Positive: r.Positive, Late: r.Late, Sum: r.Sum,
		ValueMin: r.Values.Min, ValueMax: r.Values.Max, ValueP50: r.Values.P50, ValueP90: r.Values.P90,
		ValueMeans: r.Values.Means, ValueWeights: r.Values.Weights,
	}
}

func (f *feedbackFlush) done(now time.Time) {
	s := f.stage
	s.agg.Flushed(f.starts, f.ledger.SeqThrough, now)
	for i := range f.rollups {
		if f.rollups[i].Kind == events.KindWindow {
			s.m.writeDelay.Observe(now.Sub(f.rollups[i].WindowStart.Add(s.cfg.Window)).Seconds())
		}
	}
}
