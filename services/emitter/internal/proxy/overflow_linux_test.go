package proxy

// loopStreams is how many streams the relay loop took.
func loopStreams(p *Proxy) int64 {
	if p.loops == nil {
		return 0
	}
	return p.loops.started()
}
