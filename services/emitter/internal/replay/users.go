package replay

import (
	"math/rand/v2"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// FeedbackEmitter publishes one feedback event without blocking; emit.Emitter is one.
type FeedbackEmitter interface {
	EmitFeedback(fb *events.FeedbackEvent, now time.Time) error
}

// Users are the simulated users of a simulated replay: a share of them rate each answer,
// thumbs up or down, and one in four of those also gives a 1–5 rating. Both worsen with the
// first token's wait and with stalls in the stream, as real users' do: thumbs up for 92 % of
// answers whose first token came within 500 ms, 75 % within 2 s, 45 % within 5 s and 20 %
// beyond, 25 points fewer when the stream stalled for more than a second; an answer that
// failed or timed out gets thumbs down. Users are deterministic for a seed.
type Users struct {
	Share float64 // of requests rated, 0–1
	Emit  FeedbackEmitter
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
	if u == nil || u.rng.Float64() >= u.Share {
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

func (u *Users) emit(fb *events.FeedbackEvent, stats *Stats) {
	stats.Feedback.Add(1)
	// Validated as of the verdict itself: the simulation stamps an answer's end ahead of the clock.
	if u.Emit.EmitFeedback(fb, fb.TS) != nil {
		stats.Unpublished.Add(1)
	}
}
