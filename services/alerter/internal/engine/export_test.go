package engine

// RecentLen returns how many engines' recent windows are kept, for tests.
func (e *Engine) RecentLen() int { return len(e.recent) }
