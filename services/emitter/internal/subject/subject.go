package subject

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
)

// MaxEnvs is how many envs keep a folded subject of their own, llm.req.<env>.other, at once.
const MaxEnvs = 100

// Folded is the subject of events whose env too is past the bounds.
var Folded = events.RequestSubject(ops.Other, ops.Other)

// Limit bounds the request subjects one emitter publishes on. It is safe for concurrent use.
type Limit struct {
	mu    sync.Mutex
	pairs *ops.Recent[string] // llm.req.<env>.<scene> in use
	envs  *ops.Recent[string] // llm.req.<env>.other in use
	buf   []byte

	folded  *prometheus.CounterVec
	toScene prometheus.Counter
	toOther prometheus.Counter
	inUse   prometheus.GaugeFunc
}

// New returns a Limit of max env × scene subjects at once, where a subject unseen for idle
// can give its place to a new one, counting in reg (nil for none).
func New(max int, idle time.Duration, reg prometheus.Registerer) *Limit {
	l := &Limit{pairs: ops.NewRecent[string](max, idle, nil), envs: ops.NewRecent[string](MaxEnvs, idle, nil)}
	l.folded = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Name: "subjects_folded_total",
		Help: "Events published on a folded subject: llm.req.<env>.other (to=\"scene\") or llm.req.other.other (to=\"env\")."}, []string{"to"})
	l.toScene, l.toOther = l.folded.WithLabelValues("scene"), l.folded.WithLabelValues("env")
	l.inUse = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "emitter", Name: "subjects",
		Help: "Request subjects in use (env × scene, bounded by EMITTER_MAX_SUBJECTS)."}, func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return float64(l.pairs.Len())
	})
	if reg != nil {
		reg.MustRegister(l.folded, l.inUse)
	}
	return l
}

// Request returns the subject for an event labelled env and scene, seen at now:
// llm.req.<env>.<scene> (both as events.AppendToken makes them) while that subject is in
// use or there is room for it (fewer than max, or one unseen for the idle time to replace);
// otherwise llm.req.<env>.other while the env is among the MaxEnvs most recent of those
// folded, and llm.req.other.other past that.
func (l *Limit) Request(env, scene string, now time.Time) string {
	clock := now.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = events.AppendRequestSubject(l.buf[:0], env, scene)
	if s, ok := l.pairs.Touch(string(l.buf), clock); ok {
		return s
	}
	if l.pairs.HasRoom(clock) {
		s := string(l.buf)
		l.pairs.Add(s, clock)
		return s
	}
	l.buf = events.AppendRequestSubject(l.buf[:0], env, ops.Other)
	if s, ok := l.envs.Touch(string(l.buf), clock); ok {
		l.toScene.Inc()
		return s
	}
	if l.envs.HasRoom(clock) {
		s := string(l.buf)
		l.envs.Add(s, clock)
		l.toScene.Inc()
		return s
	}
	l.toOther.Inc()
	return Folded
}
