package pipeline

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/price"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// keyWeight is how many buffered request events one held window key counts for in the
// memory bound: a key holds three digests (up to ~50 KB), an event ~250 bytes.
const keyWeight = 100

// Deps are what a pipeline runs on.
type Deps struct {
	JS        jetstream.JetStream
	NC        *nats.Conn
	CH        driver.Conn
	Publisher *bus.Publisher
	Requests  *sink.RequestWriter // nil: raw requests are not stored
	Metrics   *Metrics
	Logger    *slog.Logger
}

// NewTokens resets the request-event consumer to its stored floor, reads the ledger back from
// ClickHouse, and returns the pipeline from LLM_EVENTS to token_rollups (and requests, when
// d.Requests is set).
func NewTokens(ctx context.Context, o Options, cfg window.Config, prices *price.Table, d Deps) (*Pipeline, error) {
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
	storeRequests := d.Requests != nil
	err = untilRead(ctx, d.Logger, func() (err error) {
		if err := sk.Settle(ctx, ""); err != nil {
			return err
		}
		if done, err = sk.Done(ctx, "token_rollups", floor); err != nil {
			return err
		}
		if err := ob.read(ctx, o.Stream, "token_rollups", floor); err != nil || !storeRequests {
			return err
		}
		stored.seqs, err = sk.StoredRequests(ctx, floor)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := checkPositions(ctx, d.JS, o, floor, max(done.maxSeq(), stored.last())); err != nil {
		return nil, err
	}
	cfg.Prices = prices
	m := d.Metrics.forStream("tokens")
	st := &tokenStage{
		agg: window.New(cfg, done[cfg.Window]), dec: events.NewDecoder(4096), cfg: cfg,
		store: storeRequests, stored: stored, sink: sk, m: m,
	}
	done.otherLengths(st.agg, cfg.Window, d.Logger, o.Stream)
	if storeRequests {
		st.writer = d.Requests
		st.reqs, st.spare = d.Requests.NewBuffer(), d.Requests.NewBuffer()
	}
	d.Logger.Info("consuming", "stream", o.Stream, "consumer", o.Consumer, "floor", floor, "windows_already_stored", done.windows(), "requests_already_stored", len(stored.seqs),
		"flushes_to_publish_again", ob.flushes)
	return newPipeline(o, d.JS, d.NC, cons, floor, store, ob, st, d.Publisher, m, d.Logger.With("stream", o.Stream)), nil
}

// ledger is a rollup table's ledger read at start (sink.Done): per window length and window
// start, the stream position through which the window's events are stored.
type ledger map[time.Duration]map[time.Time]uint64

// windows returns how many windows the ledger lists.
func (l ledger) windows() int {
	n := 0
	for _, d := range l {
		n += len(d)
	}
	return n
}

// maxSeq returns the highest stream position the ledger holds.
func (l ledger) maxSeq() uint64 {
	var m uint64
	for _, d := range l {
		for _, seq := range d {
			m = max(m, seq)
		}
	}
	return m
}

// otherLengths hands agg the windows of the lengths other than window (the one the
// aggregator was made with): AGG_WINDOW changed since they were stored, and the events they
// hold must be skipped all the same, while those of their windows left open are not.
func (l ledger) otherLengths(agg interface {
	Stored(width time.Duration, done map[time.Time]uint64)
}, window time.Duration, logger *slog.Logger, stream string) {
	for width, done := range l {
		if width != window {
			agg.Stored(width, done)
			logger.Info("windows of another length stored after the floor; skipping the events they hold", "stream", stream, "window", width.String(), "windows", len(done))
		}
	}
}

// untilRead reads the ledger, retrying until it is read or ctx ends. read first waits for
// the inserts a previous process of this consumer may have left running on the server: one
// that lands after the ledger is read would be written again. A ledger read in part
// would count stored events again, so there is no way around it; but a ClickHouse that
// cannot answer in full for now (a shard of a Distributed table down: code 279) is waited
// for, not a reason to stop.
func untilRead(ctx context.Context, logger *slog.Logger, read func() error) error {
	backoff := time.Second
	var last string
	for {
		err := read()
		if err == nil {
			if last != "" {
				logger.Info("read the ledger")
			}
			return nil
		}
		if err.Error() != last {
			logger.Warn("cannot read the ledger; retrying", "err", err)
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

type tokenStage struct {
	agg *window.Aggregator
	dec *events.Decoder
	ev  events.RequestEvent
	cfg window.Config

	store       bool
	writer      *sink.RequestWriter
	stored      storedSet // requests stored before the start, after the floor
	reqs, spare *sink.Requests
	reqMin      uint64

	sink       *sink.ClickHouse
	m          *metrics
	lastFolded uint64
}

func (s *tokenStage) handle(data []byte, seq uint64, now, stored time.Time) (result, error) {
	if err := s.dec.Decode(data, &s.ev); err != nil {
		return 0, err
	}
	if err := s.ev.ValidateAt(stored); err != nil {
		return 0, err
	}
	p := s.agg.Price(&s.ev)
	res := s.agg.AddPriced(&s.ev, p, seq, now)
	if s.store && !s.stored.has(seq) {
		if s.reqs.Len() == 0 {
			s.reqMin = seq
		}
		s.reqs.Add(&s.ev, s.cfg.Buckets.Label(p.Bucket), p.USD, seq)
	}
	switch res {
	case window.AddedLate:
		return resLate, nil
	case window.Skipped:
		return resSkipped, nil
	}
	return resAdded, nil
}

func (s *tokenStage) held() (uint64, bool) {
	seq, ok := s.agg.Held()
	if s.pendingRequests() > 0 && (!ok || s.reqMin < seq) {
		return s.reqMin, true
	}
	return seq, ok
}

// maxBatch bounds the request events written in one insert: the buffers are reused, so they
// stop growing, and a flush stays short.
const maxBatch = 1 << 16

func (s *tokenStage) full() bool { return s.store && s.reqs.Len() >= maxBatch }

func (s *tokenStage) buffered() int {
	_, keys := s.agg.OpenWindows()
	return s.pendingRequests() + keyWeight*keys
}

func (s *tokenStage) pendingRequests() int {
	if !s.store {
		return 0
	}
	return s.reqs.Len()
}

func (s *tokenStage) observe(now time.Time) {
	units, keys := s.agg.OpenWindows()
	s.m.buffered.Set(float64(s.pendingRequests()))
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

func (s *tokenStage) cut(now time.Time, seqThrough uint64) flush {
	f := &tokenFlush{stage: s, ledger: sink.Ledger{SeqThrough: seqThrough, FlushID: events.NewEventID()}}
	for _, u := range s.agg.Advance(now) {
		f.rows = s.agg.Rollups(u, f.rows)
		f.starts = append(f.starts, u.Start)
		s.agg.Release(u)
	}
	if s.pendingRequests() > 0 {
		f.reqs = s.reqs
		s.reqs, s.spare = s.spare, nil
		if s.reqs == nil { // the last flush, interrupted by shutdown, still holds the spare
			s.reqs = s.writer.NewBuffer()
		}
	}
	s.stored.passed(seqThrough)
	return f
}

type tokenFlush struct {
	stage       *tokenStage
	ledger      sink.Ledger
	rows        []events.TokenRollup
	starts      []time.Time
	reqs        *sink.Requests
	reqsWritten bool
	attempt     int
	msgs        []sink.OutboxMsg
}

func (f *tokenFlush) id() sink.Ledger { return f.ledger }
func (f *tokenFlush) empty() bool     { return len(f.rows) == 0 && f.reqs == nil }
func (f *tokenFlush) count() int {
	n := len(f.rows)
	if f.reqs != nil {
		n += f.reqs.Len()
	}
	return n
}

func (f *tokenFlush) write(ctx context.Context, now time.Time) error {
	sk := f.stage.sink
	f.attempt++
	if f.attempt > 1 {
		// An earlier attempt failed; it may still land. Wait for it before counting.
		if err := sk.Settle(ctx, f.ledger.FlushID); err != nil {
			return err
		}
	}
	if f.reqs != nil && !f.reqsWritten {
		if f.attempt > 1 {
			// An earlier attempt may have stored the batch in part (a Distributed table
			// whose shards did not all take their rows): write only what is missing.
			lo, hi := f.reqs.SeqRange()
			stored, err := sk.RequestSeqsIn(ctx, lo, hi)
			if err != nil {
				return err
			}
			f.reqs.Drop(stored)
		}
		if f.reqs.Len() > 0 {
			if err := f.stage.writer.Write(ctx, f.reqs, sk.QueryID(f.ledger.FlushID+"-requests-"+strconv.Itoa(f.attempt))); err != nil {
				return err
			}
		}
		f.reqsWritten = true
	}
	if len(f.rows) == 0 {
		return nil
	}
	if f.attempt > 1 {
		n, err := sk.RowsOfFlush(ctx, "token_rollups", f.ledger.FlushID)
		if err != nil {
			return err
		}
		if n == uint64(len(f.rows)) {
			return nil
		}
	}
	qctx := sk.WithQueryID(ctx, f.ledger.FlushID+"-rollups-"+strconv.Itoa(f.attempt))
	return sk.WriteTokenRollups(qctx, f.rows, f.stage.agg.BucketLower, f.ledger, now)
}

func (f *tokenFlush) messages() []sink.OutboxMsg {
	if f.msgs == nil {
		f.msgs = encode(f.rows, f.ledger.FlushID, func(r *events.TokenRollup) (string, any) {
			return events.TokenRollupSubject(r.Env, r.Scene), r
		})
	}
	return f.msgs
}

// encode returns the message of each row, with the id <flush id>-<i>; of returns a row's
// subject and the value published for it.
func encode[R any](rows []R, flushID string, of func(r *R) (subject string, v any)) []sink.OutboxMsg {
	msgs := make([]sink.OutboxMsg, 0, len(rows))
	for i := range rows {
		subject, v := of(&rows[i])
		data, err := json.Marshal(v)
		if err != nil {
			continue // a rollup of finite numbers always encodes
		}
		msgs = append(msgs, sink.OutboxMsg{Subject: subject, ID: flushID + "-" + strconv.Itoa(i), Data: data})
	}
	return msgs
}

func (f *tokenFlush) done(now time.Time) {
	s := f.stage
	s.agg.Flushed(f.starts, f.ledger.SeqThrough, now)
	window := s.cfg.Window
	for i := range f.rows {
		if f.rows[i].Kind == events.KindWindow {
			s.m.writeDelay.Observe(now.Sub(f.rows[i].WindowStart.Add(window)).Seconds())
		}
	}
	if f.reqs != nil {
		f.reqs.Reset()
		s.spare = f.reqs
		f.reqs = nil
	}
}
