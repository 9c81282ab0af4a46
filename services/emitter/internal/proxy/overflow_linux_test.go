package proxy

// loopStreams is how many streams the relay loop took.
func loopStreams(p *Proxy) int64 {
	if p.loop == nil {
		return 0
	}
	return p.loop.started.Load()
}
