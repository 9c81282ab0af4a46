package window

import (
	"strings"
	"time"
)

// other replaces label values once the series limit is reached.
const other = "other"

type seriesID struct{ env, scene, model, instance string }

// seriesLimit bounds the distinct env × scene × model × instance series. A new series past
// the bound is folded: first its model and instance become "other", and if even that series
// is new and over the bound, every label does. Series not seen for an hour are forgotten.
type seriesLimit struct {
	max    int
	seen   map[seriesID]int64 // → clock when last seen
	folded uint64
	swept  int64
}

const seriesIdle = int64(time.Hour)

func newSeriesLimit(max int) *seriesLimit {
	return &seriesLimit{max: max, seen: map[seriesID]int64{}}
}

func (l *seriesLimit) admit(env, scene, model, instance string, clock int64) (string, string, string, string) {
	if l.max <= 0 {
		return env, scene, model, instance
	}
	id := seriesID{env, scene, model, instance}
	if last, ok := l.seen[id]; ok {
		if clock-last > int64(time.Minute) { // refreshing once a minute is enough for an hour's idle limit
			l.seen[id] = clock
		}
		return env, scene, model, instance
	}
	if len(l.seen) < l.max {
		l.seen[seriesID{strings.Clone(env), strings.Clone(scene), strings.Clone(model), strings.Clone(instance)}] = clock
		return env, scene, model, instance
	}
	l.folded++
	id = seriesID{env, scene, other, other}
	if last, ok := l.seen[id]; ok {
		if clock-last > int64(time.Minute) {
			l.seen[id] = clock
		}
		return env, scene, other, other
	}
	return other, other, other, other
}

// expire forgets series idle for an hour, at most once a minute.
func (l *seriesLimit) expire(clock int64) {
	if clock-l.swept < int64(time.Minute) {
		return
	}
	l.swept = clock
	for id, last := range l.seen {
		if clock-last > seriesIdle {
			delete(l.seen, id)
		}
	}
}
