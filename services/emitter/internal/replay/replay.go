package replay

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
	"github.com/tokenscope/tokenscope/services/emitter/internal/proxy"
)

// Emitter publishes one event without blocking; emit.Emitter is one.
type Emitter interface {
	Emit(ev *events.RequestEvent, now time.Time) error
}

// Target is a real endpoint to replay against.
type Target struct {
	Client      *llmclient.Client
	Stream      bool
	Concurrency int // requests in flight at most; a request due while all are busy is skipped and counted
}

// Options set how a workload is played. Exactly one of Simulator and Target is set.
type Options struct {
	Speed     float64 // 2 plays twice as fast as recorded; the latencies themselves are not scaled
	Loop      bool    // start over at the end, until ctx ends
	Model     string
	Scene     string
	Env       string
	Instance  string
	Simulator *Simulator
	Target    *Target
	Users     *Users // simulated users rating the answers; nil: none
	// Conversations make each request a turn of a simulated user's conversation: the event
	// carries conversation_id, turn and, on the last, the outcome; against an endpoint the
	// request sends them as X-Tokenscope-Conversation-Id and X-Tokenscope-Turn. nil: none.
	Conversations *Conversations
	Now           func() time.Time // the clock of event timestamps; time.Now when nil
}

// Stats counts what a replay did.
type Stats struct {
	Sent, OK, Errors, Timeouts, Canceled atomic.Int64
	Skipped                              atomic.Int64 // due while Target.Concurrency requests were in flight
	Unpublished                          atomic.Int64 // events the emitter refused (invalid or buffer full)
	Feedback                             atomic.Int64 // feedback events the simulated users gave
	Burst, BurstOK                       atomic.Int64 // requests of the Burst, apart from the others, and those answered ok
}

func (s *Stats) count(st events.Status) {
	switch st {
	case events.StatusOK:
		s.OK.Add(1)
	case events.StatusTimeout:
		s.Timeouts.Add(1)
	case events.StatusCanceled:
		s.Canceled.Add(1)
	default:
		s.Errors.Add(1)
	}
}

// Run plays records (ordered by At) until they end or ctx does, emitting one event per
// request, and waits for the requests in flight. A canceled ctx is a normal end.
func Run(ctx context.Context, records []Record, opts Options, emit Emitter, stats *Stats) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	speed := opts.Speed
	if speed <= 0 {
		speed = 1
	}
	var sem chan struct{}
	if opts.Target != nil {
		sem = make(chan struct{}, max(opts.Target.Concurrency, 1))
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(0)
	defer timer.Stop()
	start := time.Now()
	var offset time.Duration
	for {
		for i, rec := range records {
			due := start.Add(time.Duration(float64(offset+rec.At) / speed))
			if d := time.Until(due); d > 0 {
				timer.Reset(d)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return
				}
			} else if ctx.Err() != nil {
				return
			}
			stats.Sent.Add(1)
			if opts.Simulator != nil {
				simulate(opts, rec, now(), emit, stats)
				continue
			}
			select {
			case sem <- struct{}{}:
			default:
				stats.Skipped.Add(1)
				continue
			}
			var turn Turn
			if opts.Conversations != nil {
				turn = opts.Conversations.next()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				real(ctx, opts, rec, i, turn, emit, stats)
			}()
		}
		if !opts.Loop || len(records) == 0 {
			return
		}
		// The next round starts one mean inter-arrival after the last request.
		last := records[len(records)-1].At
		offset += last + last/time.Duration(len(records))
	}
}

func simulate(opts Options, rec Record, ts time.Time, emit Emitter, stats *Stats) {
	s := opts.Simulator.Next(rec)
	ev := &events.RequestEvent{V: events.Version, EventID: events.NewEventID(), TS: ts.UTC(), Model: opts.Model,
		Scene: opts.Scene, Env: opts.Env, Instance: opts.Instance, Provider: "simulated",
		InputTokens: rec.Input, OutputTokens: rec.Output, TTFTMs: ms(s.TTFT), TotalMs: ms(s.Total),
		Status: s.Status, ErrorCode: s.ErrorCode, HTTPStatus: s.HTTPStatus, Stream: true}
	if s.Status != events.StatusOK {
		ev.OutputTokens = 0
	}
	if rec.Output > 1 && s.Status == events.StatusOK {
		ev.MaxITLMs = ms((s.Total - s.TTFT) / time.Duration(rec.Output-1) * 3)
	}
	if cs := opts.Conversations; cs != nil {
		t := cs.next()
		ev.ConversationID, ev.Turn = t.ID(), t.N
		ev.Outcome = cs.done(t, ev)
	}
	opts.Users.score(ev)
	stats.count(s.Status)
	if emit.Emit(ev, ts) != nil {
		stats.Unpublished.Add(1)
		return
	}
	opts.Users.rate(ev, stats)
}

func real(ctx context.Context, opts Options, rec Record, i int, turn Turn, emit Emitter, stats *Stats) {
	t := opts.Target
	client := t.Client
	if turn.c != nil {
		c := *client
		c.Header = make(http.Header, len(client.Header)+2)
		for k, v := range client.Header {
			c.Header[k] = v
		}
		c.Header.Set(proxy.HeaderConversation, turn.ID())
		c.Header.Set(proxy.HeaderTurn, strconv.Itoa(turn.N))
		client = &c
	}
	out := client.Do(ctx, llmclient.Request{Model: opts.Model, Prompt: llmclient.Prompt(int(rec.Input), i),
		MaxTokens: int(max(rec.Output, 1)), Stream: t.Stream})
	if out.Status == events.StatusCanceled && ctx.Err() != nil {
		// The replay itself stopped: not the endpoint's doing, not an event.
		return
	}
	stats.count(out.Status)
	ev := out.Event(opts.Model, opts.Scene, opts.Env, t.Client.Protocol.Provider(), opts.Instance, t.Stream)
	var outcome events.Outcome
	if turn.c != nil {
		ev.ConversationID, ev.Turn = turn.ID(), turn.N
		outcome = opts.Conversations.done(turn, ev)
		ev.Outcome = outcome
	}
	if emit.Emit(ev, time.Now()) != nil {
		stats.Unpublished.Add(1)
	}
	if outcome != "" {
		opts.Users.ended(ev, outcome, opts.Conversations.upShareOf(turn), time.Now(), stats)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
