package window

import (
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

// other replaces label values once the series limit is reached.
const other = ops.Other

// MaxFoldedEnvs is how many envs keep a folded series of their own, env/other/other/other,
// at once; only past that does an event's env fold too.
const MaxFoldedEnvs = 100

type seriesID struct{ env, scene, model, instance string }

// seriesLimit bounds the distinct env × scene × model × instance series, by recency: a new
// series gets in while fewer than max are in use, or in place of the least recently seen
// one once that has been silent for the idle time. So a burst of made-up labels holds the
// places only while it lasts, and a real series arriving after it gets its own.
//
// A series that does not get in is folded: into env/scene/other/other if that series is in
// use, else into env/other/other/other, held apart for up to MaxFoldedEnvs envs, and into
// other/other/other/other only when the envs alone are past that. Series silent for an hour
// are forgotten, so memory follows what is in use.
type seriesLimit struct {
	max    int
	series *ops.Recent[seriesID]
	envs   *ops.Recent[string]
	folded uint64
	swept  int64
}

// seriesForget is how long a silent series is remembered at all.
const seriesForget = time.Hour

// seriesIdle is how long a series must be silent before a new one may take its place: five
// minutes, or twice a window and its lateness where that is longer, so that a series that
// gives its place up holds no key in an open window.
func seriesIdle(window, lateness time.Duration) time.Duration {
	return max(5*time.Minute, 2*(window+lateness))
}

func newSeriesLimit(max int, idle time.Duration) *seriesLimit {
	return &seriesLimit{max: max, series: ops.NewRecent[seriesID](max, idle, nil), envs: ops.NewRecent[string](MaxFoldedEnvs, idle, nil)}
}

func (l *seriesLimit) admit(env, scene, model, instance string, clock int64) (string, string, string, string) {
	if l.max <= 0 {
		return env, scene, model, instance
	}
	id := seriesID{env, scene, model, instance}
	if _, ok := l.series.Touch(id, clock); ok {
		return env, scene, model, instance
	}
	if l.series.HasRoom(clock) {
		l.series.Add(seriesID{strings.Clone(env), strings.Clone(scene), strings.Clone(model), strings.Clone(instance)}, clock)
		return env, scene, model, instance
	}
	l.folded++
	if _, ok := l.series.Touch(seriesID{env, scene, other, other}, clock); ok {
		return env, scene, other, other
	}
	if _, ok := l.envs.Touch(env, clock); ok {
		return env, other, other, other
	}
	if l.envs.HasRoom(clock) {
		l.envs.Add(strings.Clone(env), clock)
		return env, other, other, other
	}
	return other, other, other, other
}

// expire forgets series silent for an hour, at most once a minute.
func (l *seriesLimit) expire(clock int64) {
	if l.max <= 0 || clock-l.swept < int64(time.Minute) {
		return
	}
	l.swept = clock
	l.series.Expire(clock, seriesForget)
	l.envs.Expire(clock, seriesForget)
}
