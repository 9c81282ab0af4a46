package replay

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// FeedbackEmitter publishes or sends one feedback event; emit.Emitter is one (it does not
// block), so is a poster to an emitter's POST /v1/feedback.
type FeedbackEmitter interface {
	EmitFeedback(fb *events.FeedbackEvent, now time.Time) error
}

// Users are the simulated users of a simulated replay: a share of them rate each answer,
// thumbs up or down, and one in four of those also gives a 1–5 rating. Both worsen with the
// first token's wait and with stalls in the stream, as real users' do: thumbs up for 92 % of
// answers whose first token came within 500 ms, 75 % within 2 s, 45 % within 5 s and 20 %
// beyond, 25 points fewer when the stream stalled for more than a second; an answer that
// failed or timed out gets thumbs down. Against an endpoint, whose request events are the
// endpoint's (the proxy's) and whose event_ids the users cannot know, they rate the
// conversation instead when it ends (Conversations): a share of them give thumbs on the mean
// odds of its turns, and every one says whether the task was done (task_completed, 1 or 0), as an
// app behind the proxy reports an outcome. Users are deterministic for a seed when the
// requests end in order; safe for concurrent use.
type Users struct {
	Share float64 // of requests (of conversations, against an endpoint) rated, 0–1
	Emit  FeedbackEmitter
	mu    sync.Mutex
	rng   *rand.Rand
}

// NewUsers returns users rating share of the requests through emit.
func NewUsers(share float64, emit FeedbackEmitter, seed uint64) *Users {
	return &Users{Share: share, Emit: emit, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// upShare is the chance of a thumbs up for a request's latencies.
func upShare(ev *events.RequestEvent) float64 {
	if ev.Status != events.StatusOK {
		return 0
	}
	p := 0.2
	switch {
	case ev.TTFTMs <= 500:
		p = 0.92
	case ev.TTFTMs <= 2000:
		p = 0.75
	case ev.TTFTMs <= 5000:
		p = 0.45
	}
	if ev.MaxITLMs > 1000 {
		p -= 0.25
	}
	return max(p, 0.02)
}

// rate gives the verdicts of ev's user, if any, at the end of the answer, and counts those
// the emitter refused in stats.
func (u *Users) rate(ev *events.RequestEvent, stats *Stats) {
	if u == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rng.Float64() >= u.Share {
		return
	}
	at := ev.TS.Add(time.Duration(ev.TotalMs * float64(time.Millisecond))).Truncate(time.Millisecond)
	p := upShare(ev)
	fb := events.FeedbackEvent{V: events.Version, EventID: events.NewEventID(), TS: at, RequestID: ev.EventID,
		ConversationID: ev.ConversationID, Name: "thumbs", Source: events.SourceUser, Env: ev.Env, Scene: ev.Scene, Model: ev.Model}
	if u.rng.Float64() < p {
		fb.Value = 1
	}
	u.emit(&fb, stats)
	if u.rng.IntN(4) == 0 {
		fb.EventID, fb.Name = events.NewEventID(), "rating"
		fb.Value = float64(min(5, max(1, int(1+4*p+u.rng.NormFloat64()*0.7+0.5))))
		u.emit(&fb, stats)
	}
}

// qualityShare is the share of ok answers a simulated app's evaluator scores.
const qualityShare = 0.2

// score has the simulated app's evaluator score a fifth of the ok answers for quality, 0–1
// (mean 0.85, σ 0.07), inline on the request event as an app that judges its answers at once
// sends it.
func (u *Users) score(ev *events.RequestEvent) {
	if u == nil || ev.Status != events.StatusOK {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rng.Float64() >= qualityShare {
		return
	}
	q := min(1, max(0, 0.85+0.07*u.rng.NormFloat64()))
	ev.Scores = append(ev.Scores, events.Score{Name: "quality", Value: math.Round(q*1000) / 1000})
}

// ended gives the verdicts on a conversation that ended with outcome, whose turns had a
// mean chance up of a thumbs up, at now: thumbs for a share of them, task_completed always.
func (u *Users) ended(ev *events.RequestEvent, outcome events.Outcome, up float64, now time.Time, stats *Stats) {
	if u == nil || outcome == "" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	fb := events.FeedbackEvent{V: events.Version, EventID: events.NewEventID(), TS: now.UTC().Truncate(time.Millisecond),
		ConversationID: ev.ConversationID, Name: "task_completed", Source: events.SourceUser, Env: ev.Env, Scene: ev.Scene, Model: ev.Model}
	if outcome == events.OutcomeCompleted {
		fb.Value = 1
	}
	u.emit(&fb, stats)
	if u.rng.Float64() < u.Share {
		fb.EventID, fb.Name, fb.Value = events.NewEventID(), "thumbs", 0
		if u.rng.Float64() < up {
			fb.Value = 1
		}
		u.emit(&fb, stats)
	}
}

func (u *Users) emit(fb *events.FeedbackEvent, stats *Stats) {
	stats.Feedback.Add(1)
	// Validated as of the verdict itself: the simulation stamps an answer's end ahead of the clock.
	if u.Emit.EmitFeedback(fb, fb.TS) != nil {
		stats.Unpublished.Add(1)
	}
}
