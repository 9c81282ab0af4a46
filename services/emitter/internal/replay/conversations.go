package replay

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// openConversations is how many conversations are in progress at once: each request is the
// next turn of one of them, picked at random, so at 5.5 requests/s a user asks again about
// every 12 s.
const openConversations = 64

// maxTurns bounds a conversation's planned length.
const maxTurns = 50

// Conversations group a workload's requests into the conversations of simulated users, and
// end each with an outcome, as an app reports it on a conversation's last request. Each
// request is the next turn of one of 64 conversations in progress, picked at random, or the
// first turn of a new one in a free place. A conversation plans 1 + a geometric number of
// turns (MeanTurns on average, at most 50). A turn is bad when it failed or timed out, or was
// slow (first token after 2 s, or a stall over 1 s); after a failed turn 40 % of users give
// up at once, after a slow one 15 %, and the conversation ends abandoned. One that has its
// turns ends completed with a chance of 90 %, × 0.7 for each slow turn it had and × 0.4 for
// each failed one, else abandoned. Deterministic for a seed when the requests end in order
// (a simulated replay); safe for concurrent use.
type Conversations struct {
	MeanTurns float64
	mu        sync.Mutex
	rng       *rand.Rand
	open      [openConversations]*conversation
	prefix    string // of the ids: this replay's own, so two replays' conversations stay apart
	n         int
}

type conversation struct {
	id           string
	turn, turns  int // turns given out, turns planned
	slow, failed int
	ended        bool
	upSum        float64 // of its turns' chances of a thumbs up (Users' upShare)
	rated        int     // turns in upSum
}

// Turn is one request's place in its conversation.
type Turn struct {
	c *conversation
	N int // 1 for the first
}

// ID is the conversation's id.
func (t Turn) ID() string { return t.c.id }

// NewConversations returns conversations of meanTurns turns on average (at least 1).
func NewConversations(meanTurns float64, seed uint64) *Conversations {
	return &Conversations{MeanTurns: meanTurns, rng: rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d)),
		prefix: events.NewEventID()[:13]}
}

// next gives the next request its turn.
func (cs *Conversations) next() Turn {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	i := cs.rng.IntN(len(cs.open))
	c := cs.open[i]
	if c == nil || c.ended || c.turn >= c.turns {
		cs.n++
		c = &conversation{id: fmt.Sprintf("%s-%d", cs.prefix, cs.n), turns: cs.plan()}
		cs.open[i] = c
	}
	c.turn++
	return Turn{c: c, N: c.turn}
}

// plan draws a conversation's length: 1 + geometric with mean MeanTurns − 1.
func (cs *Conversations) plan() int {
	more := cs.MeanTurns - 1
	if !(more > 0) {
		return 1
	}
	p := 1 / (1 + more) // chance that a turn is the last
	n := 1 + int(math.Floor(math.Log(1-cs.rng.Float64())/math.Log(1-p)))
	return min(max(n, 1), maxTurns)
}

// done records how t's request went (ev) and gives the conversation's outcome when it ends
// with it; empty while it goes on, and for a turn of a conversation that already ended.
func (cs *Conversations) done(t Turn, ev *events.RequestEvent) events.Outcome {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	c := t.c
	if c.ended {
		return ""
	}
	c.upSum += upShare(ev)
	c.rated++
	quit := 0.0
	switch {
	case ev.Status != events.StatusOK:
		c.failed++
		quit = 0.4
	case ev.TTFTMs > 2000 || ev.MaxITLMs > 1000:
		c.slow++
		quit = 0.15
	}
	gaveUp := cs.rng.Float64() < quit
	if !gaveUp && t.N < c.turns {
		return ""
	}
	c.ended = true
	for i, o := range cs.open {
		if o == c {
			cs.open[i] = nil
		}
	}
	if gaveUp {
		return events.OutcomeAbandoned
	}
	p := 0.9 * math.Pow(0.7, float64(c.slow)) * math.Pow(0.4, float64(c.failed))
	if cs.rng.Float64() < p {
		return events.OutcomeCompleted
	}
	return events.OutcomeAbandoned
}

// upShareOf is the mean chance of a thumbs up of the turns of t's conversation that ended.
func (cs *Conversations) upShareOf(t Turn) float64 {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if t.c.rated == 0 {
		return 0
	}
	return t.c.upSum / float64(t.c.rated)
}
