package main

import (
	"io"
	"net"
	"sync"
)

// relayConns is what a test relay holds: the connections it forwards between its clients
// and target, both ends of each.
type relayConns struct {
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// forward dials target for c and copies both ways until either end closes, then drops
// both; when target cannot be dialled it closes c.
func (r *relayConns) forward(c net.Conn) {
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	r.conns[c], r.conns[up] = struct{}{}, struct{}{}
	r.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		r.drop(dst)
		r.drop(src)
	}
	go pipe(up, c)
	go pipe(c, up)
}

// drop resets a connection: SO_LINGER 0 makes close send RST and discard what is unsent.
func (r *relayConns) drop(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// heldLocked lists the connections held; the caller holds r.mu.
func (r *relayConns) heldLocked() []net.Conn {
	conns := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	return conns
}
