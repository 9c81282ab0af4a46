package ops

import (
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// Other is the value a label takes once its limit of distinct values is reached.
const Other = "other"

// MaxValueLen bounds a metric label value, in bytes; LabelValue cuts longer ones.
const MaxValueLen = 128

// LabelValue returns v fit to be a metric label value: every control character (CR, LF,
// NUL, DEL, the C1 range) and every byte of invalid UTF-8 becomes '_', and a value longer
// than MaxValueLen bytes is cut on a rune boundary. A value that needs none of this is
// returned as it is, without allocating.
func LabelValue(v string) string {
	clean := len(v) <= MaxValueLen
	for i := 0; clean && i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		if (r == utf8.RuneError && size == 1) || unicode.IsControl(r) {
			clean = false
		}
		i += size
	}
	if clean {
		return v
	}
	var b strings.Builder
	b.Grow(min(len(v), MaxValueLen))
	for i := 0; i < len(v); {
		r, size := utf8.DecodeRuneInString(v[i:])
		i += size
		if (r == utf8.RuneError && size == 1) || unicode.IsControl(r) {
			r, size = '_', 1
		}
		if b.Len()+size > MaxValueLen {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Limiter bounds the distinct values of one label, by recency: it admits at most max values
// at once (see Recent); a new value past that takes the place of the value seen least
// recently if that one has gone unseen for the idle time, and folds into Other otherwise.
// So a client sending a new model name per request cannot blow up the metrics, and once it
// stops, real new values get in again within the idle time. Values are sanitised first
// (LabelValue). It is safe for concurrent use.
type Limiter struct {
	mu     sync.Mutex
	set    *Recent[string]
	folded uint64
}

// NewLimiter returns a Limiter that admits max distinct values at once, where a value
// unseen for idle can give its place to a new one. evicted, when not nil, is called with
// each value that loses its place, under the limiter's lock, so that the caller deletes
// that value's series (else /metrics would keep every value ever admitted). It must not
// call the limiter.
func NewLimiter(max int, idle time.Duration, evicted func(value string)) *Limiter {
	return &Limiter{set: NewRecent[string](max, idle, evicted)}
}

// Value returns v, sanitised, if it is admitted at now, or Other.
func (l *Limiter) Value(v string, now time.Time) string {
	v = LabelValue(v)
	clock := now.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	if held, ok := l.set.Touch(v, clock); ok {
		return held
	}
	if !l.set.HasRoom(clock) {
		l.folded++
		return Other
	}
	v = strings.Clone(v) // v may alias a request body
	l.set.Add(v, clock)
	return v
}

// Folded returns how many values were folded into Other.
func (l *Limiter) Folded() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.folded
}
