//go:build !linux

package proxy

// loopStreams is how many streams the relay loop took: there is none on this platform.
func loopStreams(p *Proxy) int64 { return -1 }
