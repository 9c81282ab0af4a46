//go:build linux

package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// evloop relays the streams of the proxy's own upstream connections on one epoll loop: when an
// upstream sends a piece of a stream, the loop reads it, the meter reads it, and the loop
// writes it to the client's socket as a chunk, with no goroutine of the stream's woken, no
// second read that finds nothing (Go's poller needs one per piece) and no buffer of the
// stream's own. A piece then costs what a bare byte relay pays for it (BENCH_PROXY=floor): the
// emitter's CPU per request fell 8 % at 1,000 req/s of 20-token streams and 17 % at 200 req/s
// of 100-token ones (the README has the figures).
//
// The upstream connections (loopConn) are the loop's alone: dialled by Go, their descriptors
// leave the runtime's poller, which would otherwise be woken for every piece too. Outside a
// stream they are ordinary net.Conns whose reads and writes wait on the loop. The client's
// connection stays net/http's: the loop only writes to it, chunks framed as net/http frames
// them, while the handler waits; net/http writes the last chunk once the handler returns.
type evloop struct {
	ep     int // the epoll instance
	wake   int // an eventfd: work posted to the loop
	logger *slog.Logger

	mu      sync.Mutex
	conns   map[int32]*loopConn // by descriptor
	gen     uint32
	posted  []func()
	closed  bool
	stopped bool // the loop returned: its descriptors are closed

	started atomic.Int64 // streams relayed, for tests

	// The loop's own, used on its thread only.
	buf   []byte // what is read from an upstream
	fwd   []byte // what the meter forwards, when it strips
	frame []byte // a chunk being written
}

// Registration masks: edge-triggered, as the runtime's poller registers its descriptors.
const loopEvents = uint32(syscall.EPOLLIN|syscall.EPOLLOUT|syscall.EPOLLRDHUP) | 1<<31 // EPOLLET

func newLoop(logger *slog.Logger) (*evloop, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("cannot create an epoll instance: %w", err)
	}
	wake, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		_ = syscall.Close(ep)
		return nil, fmt.Errorf("cannot create an eventfd: %w", errno)
	}
	l := &evloop{ep: ep, wake: int(wake), conns: map[int32]*loopConn{}, logger: logger,
		buf: make([]byte, 64<<10), fwd: make([]byte, 0, 4<<10), frame: make([]byte, 0, 4<<10)}
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, l.wake, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.wake)}); err != nil {
		_ = syscall.Close(ep)
		_ = syscall.Close(l.wake)
		return nil, fmt.Errorf("cannot watch the eventfd: %w", err)
	}
	if err := syscall.SetNonblock(ep, true); err != nil {
		_ = syscall.Close(ep)
		_ = syscall.Close(l.wake)
		return nil, fmt.Errorf("cannot make the epoll instance non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(ep), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		_ = syscall.Close(l.wake)
		return nil, fmt.Errorf("cannot wait on the epoll instance: %w", err)
	}
	go l.run(rc, f)
	return l, nil
}

// run waits for events and handles them, until close. The epoll instance itself waits in the
// runtime's poller, as the watcher's does: a goroutine blocked in epoll_wait would hold a
// thread, and the runtime's monitor would take its processor back and forth, at a cost of
// its own, each time it waits.
func (l *evloop) run(rc syscall.RawConn, f *os.File) {
	defer f.Close() // the epoll instance
	evs := make([]syscall.EpollEvent, 256)
	for {
		n := 0
		var werr error
		err := rc.Read(func(fd uintptr) bool {
			n, werr = epollPoll(int(fd), evs)
			return n > 0 || (werr != nil && werr != syscall.EINTR)
		})
		if err == nil {
			err = werr
		}
		if err != nil {
			// Not a condition the loop can meet (a bad descriptor would be a bug): said, and
			// tried again, rather than the emitter stopping or the loop spinning.
			l.logger.Error("the relay loop cannot wait for events", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		for _, ev := range evs[:n] {
			if int(ev.Fd) == l.wake {
				if l.runPosted() {
					return
				}
				continue
			}
			l.mu.Lock()
			c := l.conns[ev.Fd]
			l.mu.Unlock()
			// A descriptor closed and reused since the event: its generation differs.
			if c != nil && c.gen == uint32(ev.Pad) {
				c.event(ev.Events)
			}
		}
	}
}

// post runs f on the loop.
func (l *evloop) post(f func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return // nothing of the loop's is left to run it for
	}
	l.posted = append(l.posted, f)
	one := [8]byte{1}
	_, _ = rawWrite(l.wake, one[:]) // EAGAIN: the counter is already far from zero
}

// runPosted runs what was posted; it reports whether the loop is to stop.
func (l *evloop) runPosted() (stop bool) {
	var b [8]byte
	_, _ = rawRead(l.wake, b[:])
	l.mu.Lock()
	fs := l.posted
	l.posted = nil
	l.mu.Unlock()
	for _, f := range fs {
		f()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// Closed, the loop stays until its last connection is: their Close and what they post
	// need the epoll instance and the eventfd. The eventfd is closed under mu, so that no
	// post writes to it, or to a descriptor that took its number, afterwards.
	if l.closed && len(l.conns) == 0 && len(l.posted) == 0 {
		l.stopped = true
		_ = syscall.Close(l.wake)
		return true
	}
	return false
}

// close stops the loop once its connections are closed (their owners close them) and what
// was posted has run.
func (l *evloop) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.post(func() {})
}

// adopt takes a connection Go dialled: its descriptor leaves the runtime's poller for the loop's.
func (l *evloop) adopt(nc net.Conn) (net.Conn, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nc, nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var errno syscall.Errno
	if err := rc.Control(func(s uintptr) {
		var r uintptr
		r, _, errno = syscall.Syscall(syscall.SYS_FCNTL, s, syscall.F_DUPFD_CLOEXEC, 0)
		if errno == 0 {
			fd = int(r)
		}
	}); err != nil {
		return nil, err
	}
	if errno != 0 {
		_ = nc.Close()
		return nil, fmt.Errorf("cannot take the upstream connection over: %w", errno)
	}
	// The duplicate shares the socket, non-blocking; closing Go's descriptor takes it out of
	// the runtime's poller and leaves the socket open.
	c := &loopConn{l: l, fd: fd, laddr: nc.LocalAddr(), raddr: nc.RemoteAddr(),
		rd: make(chan struct{}, 1), wr: make(chan struct{}, 1), done: make(chan struct{})}
	_ = nc.Close()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = syscall.Close(fd)
		return nil, net.ErrClosed
	}
	l.gen++
	c.gen = l.gen
	l.conns[int32(fd)] = c
	l.mu.Unlock()
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: loopEvents, Fd: int32(fd), Pad: int32(c.gen)}); err != nil {
		l.forget(c)
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("cannot watch the upstream connection: %w", err)
	}
	return c, nil
}

func (l *evloop) forget(c *loopConn) {
	l.mu.Lock()
	if l.conns[int32(c.fd)] == c {
		delete(l.conns, int32(c.fd))
	}
	last := l.closed && len(l.conns) == 0
	l.mu.Unlock()
	if last {
		l.post(func() {}) // the loop may stop now
	}
}

// loopConn is an upstream connection on the loop. Outside a stream its reads and writes wait
// for the loop to tell the descriptor is ready; during one (st set) the loop reads it itself.
type loopConn struct {
	l            *evloop
	fd           int
	gen          uint32
	laddr, raddr net.Addr

	mu     sync.Mutex // held around every use of fd, which Close ends
	closed bool
	st     *loopStream // the stream relayed from it, set and cleared on the loop
	full   bool        // the last read filled its buffer: more may be there, with no event to come
	hup    bool        // an event told the peer's end (or an error): read to the end from then on

	rd, wr chan struct{} // readiness, one token each
	done   chan struct{} // closed by Close
	rdl    atomic.Int64  // read deadline, Unix ns; 0: none
	wdl    atomic.Int64
}

// event handles the descriptor's readiness, on the loop.
func (c *loopConn) event(ev uint32) {
	readable := ev&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0
	c.mu.Lock()
	if ev&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		c.hup = true
	}
	st, closed := c.st, c.closed
	if st == nil && !closed {
		// Under mu: a stream attaching (loopStream.attach) sees the token or gets the event.
		if readable {
			notify(c.rd)
		}
		if ev&(syscall.EPOLLOUT|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
			notify(c.wr)
		}
	}
	c.mu.Unlock()
	if st != nil && !closed && readable {
		st.pump()
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// read reads once, without waiting: n > 0, or EOF (0, nil), or an error, EAGAIN included.
func (c *loopConn) read(p []byte) (int, error) {
	n, _, err := c.readNoting(p)
	return n, err
}

// readNoting is read, and tells whether an event said the peer ended.
func (c *loopConn) readNoting(p []byte) (n int, hup bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, c.hup, net.ErrClosed
	}
	for {
		n, err = rawRead(c.fd, p)
		if err == syscall.EINTR {
			continue
		}
		c.full = n == len(p)
		return max(n, 0), c.hup, err
	}
}

func (c *loopConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if err := c.expired(&c.rdl); err != nil {
			return 0, c.opErr("read", err)
		}
		n, err := c.read(p)
		switch {
		case n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == syscall.EAGAIN:
			if err := c.wait(c.rd, &c.rdl); err != nil {
				return 0, c.opErr("read", err)
			}
		default:
			return 0, c.opErr("read", err)
		}
	}
}

func (c *loopConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		if err := c.expired(&c.wdl); err != nil {
			return done, c.opErr("write", err)
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return done, c.opErr("write", net.ErrClosed)
		}
		n, err := rawWrite(c.fd, p[done:])
		c.mu.Unlock()
		if n > 0 {
			done += n
		}
		switch {
		case err == nil || err == syscall.EINTR:
		case err == syscall.EAGAIN:
			if err := c.wait(c.wr, &c.wdl); err != nil {
				return done, c.opErr("write", err)
			}
		default:
			return done, c.opErr("write", err)
		}
	}
	return done, nil
}

// wait waits for the loop's token on ch, the connection's end, or the deadline.
func (c *loopConn) wait(ch chan struct{}, deadline *atomic.Int64) error {
	d := deadline.Load()
	if d == 0 {
		select {
		case <-ch:
			return nil
		case <-c.done:
			return net.ErrClosed
		}
	}
	t := time.NewTimer(time.Until(time.Unix(0, d)))
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-c.done:
		return net.ErrClosed
	case <-t.C:
		return nil // expired tells
	}
}

func (c *loopConn) expired(deadline *atomic.Int64) error {
	if d := deadline.Load(); d != 0 && time.Now().UnixNano() >= d {
		return os.ErrDeadlineExceeded
	}
	return nil
}

func (c *loopConn) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
}

// Close closes the socket. A stream relayed from it ends on the loop.
func (c *loopConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	_ = syscall.EpollCtl(c.l.ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
	if c.st != nil {
		c.l.post(c.st.pumpAll) // the stream ends, on the loop: posted before the loop may stop
	}
	c.l.forget(c)
	_ = syscall.Close(c.fd)
	c.mu.Unlock()
	close(c.done)
	return nil
}

func (c *loopConn) LocalAddr() net.Addr  { return c.laddr }
func (c *loopConn) RemoteAddr() net.Addr { return c.raddr }

func (c *loopConn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *loopConn) SetReadDeadline(t time.Time) error {
	setDeadline(&c.rdl, t)
	notify(c.rd) // a read waiting looks at it again
	return nil
}

func (c *loopConn) SetWriteDeadline(t time.Time) error {
	setDeadline(&c.wdl, t)
	notify(c.wr)
	return nil
}

func setDeadline(d *atomic.Int64, t time.Time) {
	if t.IsZero() {
		d.Store(0)
	} else {
		d.Store(max(t.UnixNano(), 1))
	}
}

// SyscallConn lets peek and waitReadable look at the socket.
func (c *loopConn) SyscallConn() (syscall.RawConn, error) { return loopRaw{c}, nil }

type loopRaw struct{ c *loopConn }

func (r loopRaw) Control(f func(fd uintptr)) error {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.c.closed {
		return net.ErrClosed
	}
	f(uintptr(r.c.fd))
	return nil
}

func (r loopRaw) Read(f func(fd uintptr) bool) error  { return r.wait(f, r.c.rd, &r.c.rdl, true) }
func (r loopRaw) Write(f func(fd uintptr) bool) error { return r.wait(f, r.c.wr, &r.c.wdl, false) }

// wait calls f until it reports done, waiting for the loop's word in between. A reader is
// called again only once the socket is readable (or ended): a token can be stale (a deadline
// set, bytes read since), and callers such as waitReadable take their call after a wake-up
// for readiness, as they may with Go's poller.
func (r loopRaw) wait(f func(fd uintptr) bool, ch chan struct{}, deadline *atomic.Int64, read bool) error {
	call := true
	for {
		if err := r.c.expired(deadline); err != nil {
			return err
		}
		if !call {
			var b [1]byte
			if err := r.Control(func(fd uintptr) {
				_, err := recvPeek(fd, b[:])
				call = err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
			}); err != nil {
				return err
			}
		}
		if call {
			var ok bool
			if err := r.Control(func(fd uintptr) { ok = f(fd) }); err != nil {
				return err
			}
			if ok {
				return nil
			}
		}
		if err := r.c.wait(ch, deadline); err != nil {
			return err
		}
		call = !read
	}
}

// loopStream is a stream the loop relays: from its upstream connection, through the meter, to
// the client's socket. The handler (flight.onLoop) waits for its end, or for the stream to
// leave net/http; once detached, the end is settled on a goroutine of its own.
type loopStream struct {
	c    *flight
	l    *evloop
	up   *loopConn
	b    *h1Body
	out  syscall.RawConn // the client's socket
	conn net.Conn        // the same, to finish a write the socket did not take at once

	done   chan struct{} // closed when the relay ended and the handler is to settle it
	detach chan struct{} // a token: the stream is to leave net/http (open or silent long enough)

	// The loop's.
	ended, detached, asked bool
	slow                   bool  // a goroutine finishes a write; the upstream waits meanwhile
	pending                error // how the body ended (io.EOF) or broke, with the chunk being written slowly
	writeErr               error
}

// attach gives the connection's events to the stream, from the handler's goroutine. Bytes that
// came since the response's head was read left a token for a reader that no longer reads, and
// a read that filled its buffer may have left bytes that will bring no event: the loop then
// reads at once. Otherwise the next bytes bring the loop an event of their own.
func (s *loopStream) attach() {
	s.l.started.Add(1)
	up := s.up
	up.mu.Lock()
	closed, pending := up.closed, up.full
	if !closed {
		up.st = s
		select {
		case <-up.rd:
			pending = true
		default:
		}
	}
	up.mu.Unlock()
	if closed || pending {
		s.l.post(s.begin)
	}
}

// begin attaches the stream to its connection and reads what came already, on the loop.
func (s *loopStream) begin() {
	if s.ended {
		return // an event came first, and the stream ended already
	}
	s.up.mu.Lock()
	closed := s.up.closed
	if !closed {
		s.up.st = s
	}
	s.up.mu.Unlock()
	if closed {
		s.end(net.ErrClosed)
		return
	}
	s.pumpAll()
}

// pump reads what the upstream sent and relays it, until the socket has nothing more, on the
// loop. An edge-triggered event comes for every arrival, so a short read needs no second one.
func (s *loopStream) pump() { s.pumpFrom(false) }

// pumpAll reads until the socket says it has nothing more: for calls that no event brought
// (the stream taken over, a slow write finished, the connection closed), after which an
// end already there would bring none.
func (s *loopStream) pumpAll() { s.pumpFrom(true) }

// pumpFrom relays what the socket holds. After an event, a short read took all that had
// come, and the next bytes bring an event of their own, except the upstream's end when it
// came with the last bytes: the connection notes the hang-up the event told (hup), and then
// the loop reads on to the end too.
func (s *loopStream) pumpFrom(all bool) {
	if s.ended || s.slow {
		return
	}
	l := s.l
	for {
		n, hup, err := s.up.readNoting(l.buf)
		if n > 0 {
			now := time.Now()
			s.c.dog.active(now)
			data, end, ferr := s.frame(l.buf[:n])
			if ferr == nil && end {
				ferr = io.EOF
			}
			if len(data) > 0 && !s.feed(data, now) {
				if s.slow {
					s.pending = ferr // the end waits for the write
				}
				return
			}
			if ferr != nil {
				s.end(ferr)
				return
			}
			if !s.asked && now.Sub(s.c.start) >= s.c.p.detachAfter {
				s.asked = true
				notify(s.detach)
			}
			if n < len(l.buf) && !all && !hup {
				return
			}
			continue
		}
		switch {
		case err == syscall.EAGAIN:
			return
		case err == nil && s.b.chunks == nil && s.b.left < 0:
			s.end(io.EOF) // the body is the rest of the connection
		case err == nil:
			s.end(io.ErrUnexpectedEOF)
		default:
			s.end(s.up.opErr("read", err))
		}
		return
	}
}

// frame takes the body's framing off p, in place: the data, and whether the body is complete.
func (s *loopStream) frame(p []byte) (data []byte, end bool, err error) {
	b := s.b
	switch {
	case b.chunks != nil:
		data = p[:b.chunks.decode(p)]
		if e := b.chunks.err; e == io.EOF {
			end = true
		} else if e != nil {
			err = e
		}
	case b.left >= 0:
		k := min(int64(len(p)), b.left)
		if int64(len(p)) > k {
			b.keep = false // bytes after the body: the connection cannot serve another
		}
		data, b.left = p[:k], b.left-k
		end = b.left == 0
	default:
		data = p
	}
	return data, end, err
}

// feed gives data to the meter and sends what it forwards; false: the relay stopped.
func (s *loopStream) feed(data []byte, now time.Time) bool {
	m := s.c.m
	var out []byte
	if m.Stripping() {
		out = m.Feed(data, now, s.l.fwd[:0])
		if cap(out) <= maxKeptForward {
			s.l.fwd = out[:0] // grown, maybe: kept
		}
	} else {
		out = m.Feed(data, now, nil)
	}
	s.c.dog.saw(m)
	if len(out) == 0 {
		return true
	}
	return s.send(out)
}

// send writes p to the client as one chunk. What the socket does not take at once a
// goroutine finishes, the upstream waiting meanwhile: a slow client is not a silent upstream.
func (s *loopStream) send(p []byte) bool {
	f := appendChunk(s.l.frame[:0], p)
	s.l.frame = f[:0]
	n := 0
	var werr error
	if err := s.out.Write(func(fd uintptr) bool {
		for {
			n, werr = rawWrite(int(fd), f)
			if werr != syscall.EINTR {
				return true
			}
		}
	}); err != nil {
		werr = err
	}
	n = max(n, 0)
	if n == len(f) {
		return true
	}
	if werr != nil && werr != syscall.EAGAIN {
		s.writeErr = werr
		s.end(nil)
		return false
	}
	s.slow = true
	s.c.p.m.clientWaits.Inc()
	s.c.dog.writing()
	go s.finishWrite(append([]byte(nil), f[n:]...))
	return false
}

// finishWrite writes the rest of a chunk, waiting for the client, and has the loop go on.
func (s *loopStream) finishWrite(rest []byte) {
	_, err := s.conn.Write(rest)
	s.l.post(func() {
		s.slow = false
		s.c.dog.active(time.Now())
		switch {
		case err != nil:
			s.writeErr = err
			s.end(nil)
		case s.pending != nil:
			s.end(s.pending) // the body ended, or broke, with the chunk just written
		default:
			s.pumpAll() // what came meanwhile brought no event of its own
		}
	})
}

// end stops the relay, on the loop: readErr is io.EOF at the body's end, writeErr says the client
// is gone. The connection goes back to the pool or is closed, as h1Body does, and the stream is
// settled by the handler, or by a goroutine once detached.
func (s *loopStream) end(readErr error) {
	if s.ended {
		return
	}
	s.ended = true
	s.up.mu.Lock()
	s.up.st = nil
	s.up.mu.Unlock()
	rl := &s.c.rl
	switch {
	case s.writeErr != nil:
		rl.writeErr = s.writeErr
		s.b.err = errClientGone
		s.b.finish(false)
	case readErr == io.EOF:
		s.b.err = io.EOF
		rl.body.eof = true
		s.b.finish(true)
	default:
		s.b.err = readErr
		rl.body.err = readErr
		s.b.finish(false)
	}
	if s.detached {
		s.c.p.m.parked.Dec()
		go s.c.settle()
	} else {
		close(s.done)
	}
}

// handOff records that the handler detached the stream and returned, on the loop.
// Off net/http, the stream holds neither goroutine nor buffer: it counts as parked.
func (s *loopStream) handOff() {
	s.detached = true
	if s.ended {
		go s.c.settle()
		return
	}
	s.c.p.m.parked.Inc()
}

const haveLoop = true

// started counts the streams the loops have begun to relay.
func (ls *loops) started() int64 {
	var n int64
	for _, l := range ls.ls {
		n += l.started.Load()
	}
	return n
}

// onLoop relays the stream on the loop when it can: the proxy's own client reads it from a
// connection of the loop's, and the client's connection is a socket net/http got from the
// proxy's listener (ConnContext). It waits for the stream's end and settles it, or detaches
// it from net/http when asked (open for detachAfter, or silent for parkAfter) and returns.
func (c *flight) onLoop(r *http.Request, out *response) (onLoop, handedOff bool) {
	p := c.p
	b, ok := c.body.(*h1Body)
	if !ok || p.loops == nil {
		return false, false
	}
	up, ok := b.conn.nc.(*loopConn)
	if !ok {
		return false, false
	}
	nc, _ := r.Context().Value(connKey{}).(net.Conn)
	sc, ok := nc.(syscall.Conn) // not a connection given back with bytes to replay
	if !ok {
		return false, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	s := &loopStream{c: c, l: up.l, up: up, b: b, out: raw, conn: nc, done: make(chan struct{}), detach: make(chan struct{}, 1)}
	// From here a stream silent long enough is asked to detach, on s.detach.
	c.pk.Lock()
	c.ls, c.park.undecided = s, false
	c.pk.Unlock()
	c.rl = relay{out: out, dog: &c.dog, m: c.m, bufs: &p.bufs, body: upstreamBody{r: c.body, dog: &c.dog}}
	if c.relayBuffered(b) {
		c.settle()
		return true, false
	}
	s.attach()
	for {
		select {
		case <-s.done:
			c.settle()
			return true, false
		case <-s.detach:
			if c.w != nil && c.detach() {
				s.l.post(s.handOff)
				return true, true
			}
		}
	}
}

// askLoopDetach is the watchdog's, for a stream silent for parkAfter: on the loop, it holds
// no goroutine or buffer of its own already, but net/http's state for it until it detaches.
func (c *flight) askLoopDetach() bool {
	if c.ls == nil {
		return false
	}
	notify(c.ls.detach)
	return true
}

// The loop's system calls on its non-blocking descriptors return at once: made raw, they do
// not tell the scheduler, whose monitor would otherwise hand the loop's processor to another
// thread whenever one took a few tens of microseconds, as a write over loopback can here.

func rawRead(fd int, p []byte) (int, error)  { return rawIO(syscall.SYS_READ, fd, p) }
func rawWrite(fd int, p []byte) (int, error) { return rawIO(syscall.SYS_WRITE, fd, p) }

func rawIO(trap uintptr, fd int, p []byte) (int, error) {
	var ptr unsafe.Pointer
	if len(p) > 0 {
		ptr = unsafe.Pointer(&p[0])
	}
	n, _, errno := syscall.RawSyscall(trap, uintptr(fd), uintptr(ptr), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// epollPoll takes the ready events without waiting.
func epollPoll(ep int, evs []syscall.EpollEvent) (int, error) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
