package ops

import "sync"

// Other is the value a label takes once its limit of distinct values is reached.
const Other = "other"

// Limiter bounds the distinct values of one label: the first max values pass, later new
// ones fold into Other, so a client sending a new model name per request cannot blow up
// the metrics. It is safe for concurrent use.
type Limiter struct {
	mu     sync.RWMutex
	seen   map[string]struct{}
	max    int
	folded uint64
}

// NewLimiter returns a Limiter that admits max distinct values.
func NewLimiter(max int) *Limiter {
	return &Limiter{seen: make(map[string]struct{}, min(max, 1024)), max: max}
}

// Value returns v if it is admitted, or Other.
func (l *Limiter) Value(v string) string {
	l.mu.RLock()
	_, ok := l.seen[v]
	l.mu.RUnlock()
	if ok {
		return v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.max {
		l.folded++
		return Other
	}
	l.seen[v] = struct{}{}
	return v
}

// Folded returns how many values were folded into Other.
func (l *Limiter) Folded() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.folded
}
