package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// A stream is detached from net/http once it has been open for detachAfter, or earlier when its
// upstream falls silent for parkAfter (park.go): between two events, the proxy takes the
// client's connection over (hijacks it; net/http has sent the response head, chunked, and
// every chunk so far) and goes on writing the chunks itself, and the handler returns.
// net/http's per-connection state (its 4 KB reader and writer, the response's 2 KB buffer,
// the request, two goroutines) then goes, and an open stream costs the proxy's own state and
// one goroutine that holds buffers only while bytes move, or none once parked. The watcher
// tells of the client hanging up. Once the stream ends cleanly, the connection goes back to
// the HTTP server through the listener, for the client's next request.
//
// Short streams never detach: taking a connection over and giving it back costs about a tenth
// of a millisecond of CPU (a new connection for net/http, watcher calls, goroutine hand-offs;
// measured with every stream detached), paid once by a stream that lasts, and saved by a
// request of a few hundred milliseconds.
//
// Only streams relayed as they come (identity encoding) on HTTP/1.1 over plain TCP, accepted
// through the proxy's listener, are detached: HTTP/2 cannot be hijacked, TLS cannot be watched
// on the descriptor, HTTP/1.0 has no chunking, and a gzip stream is inside its decoder between
// two events.
const detachAfter = 500 * time.Millisecond // Proxy.detachAfter; tests shorten it

// errShutdown ends the streams still open when the shutdown grace is over.
var errShutdown = errors.New("the emitter is shutting down")

// CodeShutdown is the error code of a stream cut when the shutdown grace ran out.
const CodeShutdown = "emitter_shutdown"

// detached is the client's side of a stream the proxy took over.
type detached struct {
	p       *Proxy
	conn    net.Conn
	pending []byte // bytes of the client's next request that net/http had read
	keep    bool   // the client did not ask to close the connection after this response
	watch   uint64 // the watcher's id for the hang-up; 0 when not watched
	cancel  context.CancelCauseFunc
}

// canDetach reports whether the stream of r may be detached.
func (p *Proxy) canDetach(r *http.Request, x *exchange) bool {
	return p.ln != nil && x.stream && !x.unread && r.ProtoMajor == 1 && r.ProtoMinor >= 1 && r.TLS == nil
}

// detach takes the client's connection over from net/http, which has written the response
// head and every chunk so far. It returns nil when it cannot (the proxy is shutting down, or
// net/http refuses), and the stream stays with net/http.
func (p *Proxy) detach(w http.ResponseWriter, keep bool, cancel context.CancelCauseFunc) *detached {
	d := &detached{p: p, keep: keep, cancel: cancel}
	// Tracked before it leaves net/http, whose Shutdown stops waiting for it then.
	if !p.open.add(d) {
		return nil
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.open.remove(d)
		return nil
	}
	var buffered []byte
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		buffered = append([]byte(nil), b...)
	}
	conn, pending := unwrap(conn, buffered)
	p.open.mu.Lock() // Drain may look at it
	d.conn, d.pending = conn, pending
	p.open.mu.Unlock()
	p.m.detached.Inc()
	p.m.detaches.Inc()

	if sc, ok := d.conn.(syscall.Conn); ok {
		d.watch, err = p.watch.add(sc, hangUp, func(uint64) { cancel(errClientGone) })
	} else {
		err = errors.New("not a socket")
	}
	p.watchFailed(err)
	return d
}

// watchFailed logs a connection the watcher could not take, when that starts or stops
// happening: such a stream notices its client hanging up only at its next write.
func (p *Proxy) watchFailed(err error) {
	if p.watchFailing.Swap(err != nil) == (err != nil) {
		return
	}
	if err != nil {
		p.logger.Warn("cannot watch clients for hang-ups; streams notice them at their next write", "err", err)
	} else {
		p.logger.Info("watching clients for hang-ups again")
	}
}

// chunkBufs hold a chunk being written: taken for one write, so an idle stream holds none.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10+16); return &b }}

// send writes p as one chunk, in one write.
func (d *detached) send(p []byte) error {
	if len(p) == 0 {
		return nil // a zero-length chunk would end the body
	}
	if len(p) > 64<<10 {
		var hex [18]byte // 16 digits and CRLF
		v := net.Buffers{append(strconv.AppendInt(hex[:0], int64(len(p)), 16), "\r\n"...), p, crlf}
		_, err := v.WriteTo(d.conn)
		return err
	}
	bp := chunkBufs.Get().(*[]byte)
	b := appendChunk((*bp)[:0], p)
	_, err := d.conn.Write(b)
	*bp = b[:0]
	chunkBufs.Put(bp)
	return err
}

var crlf = []byte("\r\n")

// appendChunk appends p to b framed as one chunk of the chunked coding, as net/http frames
// what a handler flushes; p must not be empty (a zero-length chunk ends the body).
func appendChunk(b, p []byte) []byte {
	b = strconv.AppendInt(b, int64(len(p)), 16)
	b = append(b, "\r\n"...)
	b = append(b, p...)
	return append(b, "\r\n"...)
}

// abort breaks the connection: the client sees the response cut short.
func (d *detached) abort() { _ = d.conn.Close() }

// end finishes the response when the stream ended cleanly and gives the connection back for
// the client's next request, or closes it.
func (d *detached) end(clean bool) {
	defer d.p.open.remove(d)
	d.p.m.detached.Dec()
	if clean {
		_, err := d.conn.Write(lastChunk)
		clean = err == nil
	}
	// A connection the watcher does not watch is closed: the client opens another.
	if clean && d.keep && d.watch != 0 && d.p.ln.giveBack(d.conn, d.watch, d.pending) {
		return
	}
	if d.watch != 0 {
		d.p.watch.remove(d.watch)
	}
	_ = d.conn.Close()
}

var lastChunk = []byte("0\r\n\r\n")

// streamSet tracks the detached streams, which http.Server.Shutdown no longer waits for.
type streamSet struct {
	mu      sync.Mutex
	open    map[*detached]struct{}
	empty   chan struct{} // closed when open empties, for Drain
	closing bool
}

func (s *streamSet) add(d *detached) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	if s.open == nil {
		s.open = map[*detached]struct{}{}
	}
	s.open[d] = struct{}{}
	return true
}

func (s *streamSet) remove(d *detached) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, d)
	if len(s.open) == 0 && s.empty != nil {
		close(s.empty)
		s.empty = nil
	}
}

// wait returns once no stream is open, or when ctx ends.
func (s *streamSet) wait(ctx context.Context) error {
	s.mu.Lock()
	if len(s.open) == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.empty == nil {
		s.empty = make(chan struct{})
	}
	empty := s.empty
	s.mu.Unlock()
	select {
	case <-empty:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Drain waits for the detached streams to end; it is for after the HTTP server's Shutdown
// (ops.Server.OnShutdown), which waits for the others. When ctx ends first, every measured
// request still open is cut, detached or still net/http's (Shutdown gave up waiting for
// those when ctx ended): their events say error, emitter_shutdown, and Drain returns ctx's
// error once they are out.
func (p *Proxy) Drain(ctx context.Context) error {
	p.open.mu.Lock()
	p.open.closing = true // a handler still running keeps its stream
	p.open.mu.Unlock()
	err := p.open.wait(ctx)
	if err == nil {
		if err = ctx.Err(); err == nil || p.flights.empty() {
			return nil
		}
	}
	p.flights.cut(errShutdown)
	p.open.mu.Lock()
	for d := range p.open.open {
		if d.conn != nil {
			// Unblocks a write to a client that stopped reading.
			_ = d.conn.SetWriteDeadline(time.Unix(1, 0))
		}
	}
	p.open.mu.Unlock()
	settle, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = p.flights.wait(settle)
	_ = p.open.wait(settle)
	return err
}

// flightSet tracks the measured requests from when they go upstream until their event is
// out, wherever they are: in a handler, on the relay loop, detached or parked.
type flightSet struct {
	mu    sync.Mutex
	open  map[*flight]struct{}
	done  chan struct{} // closed when open empties, for wait
	gone  bool          // cut: flights added later are cut at once
	cause error
}

func (s *flightSet) add(c *flight) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		c.cancel(s.cause)
	}
	if s.open == nil {
		s.open = map[*flight]struct{}{}
	}
	s.open[c] = struct{}{}
}

func (s *flightSet) remove(c *flight) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.open, c)
	if len(s.open) == 0 && s.done != nil {
		close(s.done)
		s.done = nil
	}
}

func (s *flightSet) empty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open) == 0
}

// cut ends the upstream request of every flight open, and of those that come later, and
// unblocks their writes to clients that stopped reading.
func (s *flightSet) cut(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone, s.cause = true, cause
	for c := range s.open {
		c.cancel(cause)
		if c.rc != nil {
			_ = c.rc.SetWriteDeadline(time.Unix(1, 0))
		}
	}
}

// writing records rc, net/http's writer of c's answer, while c's handler may write with
// it; nil once the handler returns.
func (s *flightSet) writing(c *flight, rc *http.ResponseController) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.rc = rc
	if rc != nil && s.gone {
		_ = rc.SetWriteDeadline(time.Unix(1, 0))
	}
}

// wait returns once no flight is open, or when ctx ends.
func (s *flightSet) wait(ctx context.Context) error {
	s.mu.Lock()
	if len(s.open) == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.done == nil {
		s.done = make(chan struct{})
	}
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
