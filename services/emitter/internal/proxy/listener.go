package proxy

import (
	"net"
	"sync"
	"time"
)

// listener is the HTTP server's listener as the proxy sees it: Accept returns the new
// connections and those the proxy took over for a stream and gives back once the stream
// ended cleanly, so that a client's kept-alive connection serves its next request as before.
// A connection given back waits for that request in the watcher, holding nothing of
// net/http's, and goes to the server once the client sends it (or hangs up): net/http's
// header timeout then starts as it does for a kept-alive connection. One that waits longer
// than idle is closed, as net/http closes its own idle ones (http.Server.IdleTimeout).
type listener struct {
	net.Listener
	w        *watcher
	idle     time.Duration
	accepted chan accepted
	back     chan net.Conn
	done     chan struct{}
	once     sync.Once

	mu     sync.Mutex
	parked map[uint64]parkedConn // given back, the client's next request not yet there
	closed bool
}

type parkedConn struct {
	c     net.Conn
	timer *time.Timer // closes it once idle has passed
}

type accepted struct {
	c   net.Conn
	err error
}

func newListener(ln net.Listener, w *watcher, idle time.Duration) *listener {
	l := &listener{Listener: ln, w: w, idle: idle, accepted: make(chan accepted), back: make(chan net.Conn),
		done: make(chan struct{}), parked: map[uint64]parkedConn{}}
	go l.acceptLoop()
	return l
}

// acceptLoop accepts one connection at a time, each when Accept asks for it, so errors and
// their backoff stay http.Server's.
func (l *listener) acceptLoop() {
	for {
		c, err := l.Listener.Accept()
		select {
		case l.accepted <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
	}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.accepted:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting and closes the connections waiting for a next request, as
// http.Server.Shutdown closes its idle ones.
func (l *listener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() {
		close(l.done)
		l.mu.Lock()
		parked := l.parked
		l.parked, l.closed = nil, true
		l.mu.Unlock()
		for id, p := range parked {
			p.timer.Stop()
			l.w.remove(id)
			_ = p.c.Close()
		}
	})
	return err
}

// giveBack returns c, whose hang-up the watcher watches under id, to the server for the
// client's next request; pending holds bytes of it that net/http had already read from c,
// and c may hold more itself (framingConn.held). It reports false, and c is the caller's
// still, when the client hung up.
func (l *listener) giveBack(c net.Conn, id uint64, pending []byte) bool {
	if fc, ok := c.(*framingConn); len(pending) > 0 || (ok && fc.held()) {
		if !l.w.remove(id) {
			return false
		}
		l.handBack(&replayConn{Conn: c, pending: pending})
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		if l.w.remove(id) {
			_ = c.Close()
			return true
		}
		return false
	}
	// Under l.mu: the event may fire at once, and wake must find the connection parked.
	id, ok := l.w.rearm(id, readOrHangUp, l.wake)
	if ok {
		l.parked[id] = parkedConn{c: c, timer: time.AfterFunc(l.idle, func() { l.expire(id) })}
	}
	return ok
}

// expire closes a parked connection whose client sent nothing for the idle timeout, unless
// its event came first (wake has it then).
func (l *listener) expire(id uint64) {
	l.mu.Lock()
	p, ok := l.parked[id]
	if !ok || !l.w.remove(id) {
		l.mu.Unlock()
		return
	}
	delete(l.parked, id)
	l.mu.Unlock()
	_ = p.c.Close()
}

// wake sends a parked connection, whose client sent its next request or hung up, to the
// server. It runs on the watcher's goroutine, which must not wait for Accept.
func (l *listener) wake(id uint64) {
	l.mu.Lock()
	p, ok := l.parked[id]
	delete(l.parked, id)
	l.mu.Unlock()
	if !ok {
		return
	}
	p.timer.Stop()
	select {
	case l.back <- p.c: // Accept was waiting, as it mostly is
	default:
		go l.handBack(p.c)
	}
}

func (l *listener) handBack(c net.Conn) {
	select {
	case l.back <- c:
	case <-l.done:
		_ = c.Close()
	}
}

// replayConn is a connection given back with bytes of the client's next request that net/http
// had read before the proxy took the connection over: they are read first.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		return c.Conn.Read(p)
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// CloseWrite lets net/http close a connection gracefully, as it does a TCP one.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// unwrap returns the connection under c, and the bytes still to be replayed after what
// net/http buffered (buffered): the proxy takes the connection over again.
func unwrap(c net.Conn, buffered []byte) (net.Conn, []byte) {
	if rc, ok := c.(*replayConn); ok {
		return rc.Conn, append(buffered, rc.pending...)
	}
	return c, buffered
}
