package ops

import "time"

// Recent is a bounded set of keys ordered by when each was last seen: the values a label
// limit admits. A new key gets in while there is room, or in place of the least recently
// seen key once that one has gone unseen for the idle time; otherwise it is refused. So a
// burst of new values fills the set and keeps it only while it goes on: once the burst's
// values stop coming, new real values get their place back within the idle time, where a
// first-come set would refuse them for as long as it remembers the burst.
//
// Clocks are unix nanoseconds from the caller. Recent is not safe for concurrent use.
type Recent[K comparable] struct {
	max     int
	idle    int64
	evicted func(K)
	nodes   map[K]*recentNode[K]
	newest  *recentNode[K]
	oldest  *recentNode[K]
}

type recentNode[K comparable] struct {
	key          K
	seen         int64
	newer, older *recentNode[K]
}

// NewRecent returns a set of at most size keys (at least 1), where a key unseen for idle can
// give its place to a new one. evicted, when not nil, is called with each key that leaves
// the set, by Add or Expire.
func NewRecent[K comparable](size int, idle time.Duration, evicted func(K)) *Recent[K] {
	size = max(size, 1)
	return &Recent[K]{max: size, idle: int64(idle), evicted: evicted, nodes: make(map[K]*recentNode[K], min(size, 1024))}
}

// Len returns how many keys the set holds.
func (r *Recent[K]) Len() int { return len(r.nodes) }

// Touch reports whether k is in the set, and marks it seen at clock if so. It returns the
// key as the set holds it: equal to k, but made when it was added (a string that aliases a
// request body is kept only by the caller).
func (r *Recent[K]) Touch(k K, clock int64) (K, bool) {
	n := r.nodes[k]
	if n == nil {
		return k, false
	}
	if n != r.newest {
		r.unlink(n)
		r.push(n)
	}
	// Kept in order even when callers' clocks are a little out of step with each other.
	n.seen = max(n.seen, clock)
	if n.older != nil {
		n.seen = max(n.seen, n.older.seen)
	}
	return n.key, true
}

// HasRoom reports whether Add would take a new key at clock, so a caller can skip making
// one (cloning its strings) that would be refused.
func (r *Recent[K]) HasRoom(clock int64) bool {
	return len(r.nodes) < r.max || clock-r.oldest.seen >= r.idle
}

// Add puts k, which is not in the set, in it as seen at clock, in place of the least
// recently seen key when the set is full and that key has been unseen for the idle time.
// It reports whether k got in.
func (r *Recent[K]) Add(k K, clock int64) bool {
	var n *recentNode[K]
	switch {
	case len(r.nodes) < r.max:
		n = &recentNode[K]{}
	case clock-r.oldest.seen >= r.idle:
		n = r.oldest
		r.unlink(n)
		delete(r.nodes, n.key)
		if r.evicted != nil {
			r.evicted(n.key)
		}
		*n = recentNode[K]{}
	default:
		return false
	}
	n.key = k
	n.seen = clock
	if r.newest != nil {
		n.seen = max(clock, r.newest.seen)
	}
	r.push(n)
	r.nodes[k] = n
	return true
}

// Expire removes the keys last seen before clock - age, so memory follows what is in use.
func (r *Recent[K]) Expire(clock int64, age time.Duration) {
	for r.oldest != nil && clock-r.oldest.seen > int64(age) {
		n := r.oldest
		r.unlink(n)
		delete(r.nodes, n.key)
		if r.evicted != nil {
			r.evicted(n.key)
		}
	}
}

func (r *Recent[K]) unlink(n *recentNode[K]) {
	if n.newer != nil {
		n.newer.older = n.older
	} else {
		r.newest = n.older
	}
	if n.older != nil {
		n.older.newer = n.newer
	} else {
		r.oldest = n.newer
	}
	n.newer, n.older = nil, nil
}

func (r *Recent[K]) push(n *recentNode[K]) {
	n.older = r.newest
	if r.newest != nil {
		r.newest.newer = n
	} else {
		r.oldest = n
	}
	r.newest = n
}
