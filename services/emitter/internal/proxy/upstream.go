package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// h1 is the proxy's HTTP/1.1 client for plain-HTTP upstreams (an inference server in the same
// cluster, the fake LLM), used when the request body is in memory. http.Transport keeps two
// goroutines per connection and hands every request and response between them and the
// caller; with thousands of streams open that is most of the proxy's memory, and at a
// thousand requests a second a good share of its CPU. Here the handler's goroutine writes the
// request and reads the response itself, on a pooled keep-alive connection; net/http still
// parses the response (http.ReadResponse). TLS upstreams, upstreams behind an HTTP proxy,
// bodies streamed through unread, and the unmeasured paths keep using http.Transport.
type h1 struct {
	dialer      net.Dialer
	maxIdle     int // idle connections kept per upstream
	idleTimeout time.Duration
	maxHeader   int64         // bytes of response headers, 1xx ones included, as http.Transport's limit
	sweepEvery  time.Duration // how often the idle connections are checked

	mu      sync.Mutex
	idle    map[string][]*h1Conn // by host:port, most recently used last
	closed  bool
	sweeper *time.Timer // armed while connections are idle

	loops *loops // take the connections dialled, when set (before the first request)
}

type h1Conn struct {
	nc     net.Conn
	lr     limitedConn   // what br reads from
	br     *bufio.Reader // from h1Readers, only while headers are read and what came with them is
	addr   string
	reused bool
	idleAt time.Time
}

// h1Readers hold the response headers being read and the first bytes of the body that come
// with them. A connection takes one once its answer starts to come, and gives it back once the
// body has read what it holds: a stream waiting for its upstream, or a request for its answer
// (a long prefill), holds no read buffer.
var h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, h1ReadBuffer) }}

// buffered reports how many bytes were read from the connection and not yet taken.
func (conn *h1Conn) buffered() int {
	if conn.br == nil {
		return 0
	}
	return conn.br.Buffered()
}

// reader takes a header reader for the connection.
func (conn *h1Conn) reader() *bufio.Reader {
	if conn.br == nil {
		conn.br = h1Readers.Get().(*bufio.Reader)
		conn.br.Reset(&conn.lr)
	}
	return conn.br
}

// release gives the header reader back; what it still holds is lost.
func (conn *h1Conn) release() {
	if conn.br != nil {
		conn.br.Reset(nil)
		h1Readers.Put(conn.br)
		conn.br = nil
	}
}

// limitedConn reads from a connection at most n bytes: the limit on a response's headers
// while they are read, none (maxInt64) while its body is.
type limitedConn struct {
	nc net.Conn
	n  int64
}

func (l *limitedConn) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeadersTooBig
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.nc.Read(p)
	l.n -= int64(n)
	return n, err
}

const noLimit = 1<<63 - 1

var errHeadersTooBig = errors.New("the upstream's response headers are too big")

// defaultMaxHeader is http.Transport's default MaxResponseHeaderBytes.
const defaultMaxHeader = 10 << 20

// h1ReadBuffer is the size of a header reader: the headers of most answers in one read.
// Longer header lines and bigger reads work too, in more pieces.
const h1ReadBuffer = 1 << 10

func newH1(maxIdle int, idleTimeout time.Duration) *h1 {
	return &h1{dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle: maxIdle, idleTimeout: idleTimeout, maxHeader: defaultMaxHeader,
		sweepEvery: min(idleTimeout, 5*time.Second), idle: map[string][]*h1Conn{}}
}

// canDial reports whether the upstream at u is one h1 serves: plain HTTP, not through an
// HTTP proxy.
func canDial(u *url.URL) bool {
	if u.Scheme != "http" {
		return false
	}
	p, err := http.ProxyFromEnvironment(&http.Request{URL: u})
	return err == nil && p == nil
}

// roundTrip sends req with body and returns the response once its headers are in; the
// response's body gives the connection back when read to its end. req's context ends the
// exchange at any point, as with http.Transport. A pooled connection that turns out to be
// closed is replaced once, when that is safe (see exchange).
func (c *h1) roundTrip(req *http.Request, body []byte) (*http.Response, error) {
	ctx := req.Context()
	// Not pooled: a burst of thousands of streams would leave thousands in the pool.
	head, err := writeHead(req, body)
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		conn, err := c.get(ctx, hostPort(req.URL.Host))
		if err != nil {
			return nil, err
		}
		resp, err := c.exchange(ctx, conn, req, head, body)
		if err == nil {
			return resp, nil
		}
		if !errors.Is(err, errRetry) || attempt > 0 || ctx.Err() != nil {
			return nil, err
		}
	}
}

var errRetry = errors.New("the upstream closed a kept-alive connection before answering")

func (c *h1) exchange(ctx context.Context, conn *h1Conn, req *http.Request, head, body []byte) (*http.Response, error) {
	// Ending the context unblocks whatever the connection is doing, and spoils it. Closing,
	// not a deadline in the past: a parked stream's goroutine uses the read deadline.
	stop := context.AfterFunc(ctx, func() { _ = conn.nc.Close() })
	// A kept-alive connection the upstream closed just as this request went out: if the
	// request did not get out whole, the upstream cannot have acted on it, and the proxy
	// sends it again on a new connection. If it got out and no answer came, it is sent again
	// only if the client says it may be (Idempotency-Key), as http.Transport does.
	retry := conn.reused
	fail := func(err error) (*http.Response, error) {
		stop()
		conn.release()
		_ = conn.nc.Close()
		if retry && ctx.Err() == nil {
			return nil, errors.Join(errRetry, err)
		}
		return nil, err
	}
	var err error
	if len(body) <= smallBody {
		_, err = conn.nc.Write(head[:len(head)+len(body)]) // writeHead put the body after the head
	} else {
		bufs := net.Buffers{head, body}
		_, err = bufs.WriteTo(conn.nc)
	}
	wrote := err == nil
	if !wrote {
		// The upstream may have answered before reading the whole request (a 413, say) and
		// stopped reading: its answer is the one to relay, as http.Transport would.
		if peek(conn.nc) != ready {
			return fail(err)
		}
		retry = false
	}
	retry = retry && (req.Header.Get("Idempotency-Key") != "" || req.Header.Get("X-Idempotency-Key") != "")
	// The answer may take minutes (a long prefill): wait for it without a buffer.
	if err := waitReadable(conn.nc); err != nil {
		return fail(err)
	}
	// The headers of the answer, 1xx ones included, are bounded as with http.Transport.
	conn.lr.n = c.maxHeader
	br := conn.reader()
	if _, err := br.Peek(1); err != nil {
		return fail(err)
	}
	retry = false
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(br, req)
		if err != nil && conn.lr.n <= 0 {
			err = errHeadersTooBig
		}
		if err != nil {
			return fail(err)
		}
		// 1xx answers (100 Continue, 103 Early Hints) come before the real one.
		if resp.StatusCode >= 200 {
			break
		}
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// The proxy never asks for an upgrade (Upgrade is not forwarded): what follows
			// on the connection is not HTTP/1.1.
			return fail(errors.New("the upstream switched protocols unasked"))
		}
	}
	conn.lr.n = noLimit
	// An open stream need not keep the request it answers (its headers, its URL).
	resp.Request = nil
	// The body is read from the connection by h1Body, framing included, not by net/http's
	// reader, which would keep the header reader for as long as the body lasts.
	b := &h1Body{c: c, conn: conn, stop: stop, keep: !resp.Close && wrote, left: -1}
	switch {
	case resp.Body == http.NoBody:
		b.finish(true)
	case len(resp.TransferEncoding) > 0: // ReadResponse refuses any other coding than chunked
		b.chunks = &chunked{src: b.raw()}
	case resp.ContentLength >= 0:
		b.left = resp.ContentLength
	}
	resp.Body = b
	return resp, nil
}

// smallBody is the largest body sent in the same write as the request's head.
const smallBody = 16 << 10

// writeHead renders the request line and headers. A small body is copied after them, past
// the returned slice's length, so that both go in one write. Like http.Transport, it refuses
// a header field name or value, a target or a host that could end a line or the head early.
func writeHead(req *http.Request, body []byte) ([]byte, error) {
	uri := req.URL.RequestURI()
	if !validValue(uri) || strings.ContainsAny(uri, " \t") || !validValue(req.URL.Host) || strings.ContainsAny(req.URL.Host, " \t") {
		return nil, errors.New("invalid request target or host")
	}
	size := 64 + len(req.URL.Path) + len(req.URL.RawQuery) + len(req.URL.Host)
	for k, vs := range req.Header {
		for _, v := range vs {
			size += len(k) + len(v) + 4
		}
	}
	if len(body) <= smallBody {
		size += len(body)
	}
	b := make([]byte, 0, size)
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, req.URL.Host...)
	b = append(b, "\r\n"...)
	for k, vs := range req.Header {
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect", "Trailer":
			continue // the proxy frames the request itself
		}
		if !validName(k) {
			return nil, fmt.Errorf("invalid header field name %q", k)
		}
		for _, v := range vs {
			if !validValue(v) {
				return nil, fmt.Errorf("invalid header field value for %q", k)
			}
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	if len(body) > 0 || req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	if len(body) <= smallBody {
		b = append(b, body...)[:len(b)]
	}
	return b, nil
}

// validName reports whether k is a token (RFC 9110, 5.1).
func validName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 0x80 || !tokenChar[c] {
			return false
		}
	}
	return true
}

var tokenChar = func() (t [128]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// validValue reports whether v holds no control character but tab (RFC 9110, 5.5), as
// net/http's check of header values does.
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// peekState is what a look at a connection's read side found.
type peekState uint8

const (
	unknown peekState = iota // this platform cannot tell
	idle                     // open, nothing to read
	ready                    // bytes to read
	gone                     // closed or broken
)

func hostPort(host string) string {
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), "80")
}

// get returns an idle connection to addr that is still open, or dials one.
func (c *h1) get(ctx context.Context, addr string) (*h1Conn, error) {
	now := time.Now()
	for {
		c.mu.Lock()
		list := c.idle[addr]
		if len(list) == 0 {
			c.mu.Unlock()
			break
		}
		conn := list[len(list)-1]
		list[len(list)-1] = nil
		c.idle[addr] = list[:len(list)-1]
		c.mu.Unlock()
		// An idle connection with bytes to read, or closed, is of no use: the upstream closes
		// idle ones (uvicorn, which vLLM runs on, after 5 s).
		if now.Sub(conn.idleAt) < c.idleTimeout && conn.buffered() == 0 {
			if st := peek(conn.nc); st == idle || st == unknown {
				conn.reused = true
				return conn, nil
			}
		}
		_ = conn.nc.Close()
	}
	nc, err := c.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if c.loops != nil {
		if nc, err = c.loops.adopt(nc); err != nil {
			return nil, err
		}
	}
	return &h1Conn{nc: nc, lr: limitedConn{nc: nc, n: noLimit}, addr: addr}, nil
}

// put keeps conn for the next request to its upstream.
func (c *h1) put(conn *h1Conn) {
	conn.idleAt = time.Now()
	leftover := conn.buffered() > 0
	conn.release()
	c.mu.Lock()
	if c.closed || len(c.idle[conn.addr]) >= c.maxIdle || leftover {
		c.mu.Unlock()
		_ = conn.nc.Close()
		return
	}
	c.idle[conn.addr] = append(c.idle[conn.addr], conn)
	if c.sweeper == nil {
		c.sweeper = time.AfterFunc(c.sweepEvery, c.sweep)
	}
	c.mu.Unlock()
}

// sweep closes the idle connections past the idle timeout, and those the upstream closed or
// sent something on. Without it an idle connection is looked at only when taken, and one
// under a burst's worth of others could stay open, closed at the upstream's end, for good.
func (c *h1) sweep() {
	now := time.Now()
	var drop []*h1Conn
	c.mu.Lock()
	for addr, list := range c.idle {
		keep := list[:0]
		for _, conn := range list {
			st := gone
			if now.Sub(conn.idleAt) < c.idleTimeout {
				st = peek(conn.nc) // without waiting: fine under the lock
			}
			if st == idle || st == unknown {
				keep = append(keep, conn)
			} else {
				drop = append(drop, conn)
			}
		}
		clear(list[len(keep):])
		if len(keep) == 0 {
			delete(c.idle, addr)
		} else {
			c.idle[addr] = keep
		}
	}
	if len(c.idle) > 0 && c.sweeper != nil {
		c.sweeper.Reset(c.sweepEvery)
	} else {
		c.sweeper = nil
	}
	c.mu.Unlock()
	for _, conn := range drop {
		_ = conn.nc.Close()
	}
}

// closeIdle closes the idle connections; with stop, those given back later too.
func (c *h1) closeIdle(stop bool) {
	c.mu.Lock()
	idle := c.idle
	c.idle = map[string][]*h1Conn{}
	c.closed = c.closed || stop
	if c.sweeper != nil {
		c.sweeper.Stop()
		c.sweeper = nil
	}
	c.mu.Unlock()
	for _, list := range idle {
		for _, conn := range list {
			_ = conn.nc.Close()
		}
	}
}

// h1Body is a response body read straight from the connection: first what the header reader
// holds, then the connection itself, into the caller's buffer. Read to its end, it gives the
// connection back; closed before, it closes it (http's body would read the rest first).
type h1Body struct {
	c        *h1
	conn     *h1Conn
	stop     func() bool
	keep     bool
	chunks   *chunked // the chunked coding's state; nil for other framings
	left     int64    // bytes left with a Content-Length, -1 without: read to the end
	finished bool
	err      error // what the reads after the end get: io.EOF, or how the body broke off
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.finished {
		if b.err == nil {
			return 0, io.EOF // an empty body
		}
		return 0, b.err
	}
	var n int
	var err error
	switch {
	case b.chunks != nil:
		n, err = b.chunks.Read(p)
	case b.left == 0:
		err = io.EOF
	case b.left > 0:
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err = b.raw().Read(p)
		if b.left -= int64(n); b.left == 0 {
			err = io.EOF
		} else if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
	default:
		n, err = b.raw().Read(p)
	}
	if err != nil {
		b.err = err
		b.finish(err == io.EOF)
	}
	return n, err
}

// raw reads the connection's bytes: those the header reader holds, then the connection's.
func (b *h1Body) raw() rawBody { return rawBody{b.conn} }

type rawBody struct{ conn *h1Conn }

func (r rawBody) Read(p []byte) (int, error) {
	if r.conn.buffered() > 0 {
		return r.conn.br.Read(p)
	}
	r.conn.release()
	return r.conn.nc.Read(p)
}

// wait blocks until the upstream sends something, without a buffer: an idle stream holds none.
func (b *h1Body) wait() error {
	if b.finished || b.conn.buffered() > 0 {
		return nil
	}
	b.conn.release()
	return waitReadable(b.conn.nc)
}

func (b *h1Body) Close() error {
	if !b.finished {
		b.err = http.ErrBodyReadAfterClose
	}
	b.finish(false)
	return nil
}

func (b *h1Body) finish(atEnd bool) {
	if b.finished {
		return
	}
	b.finished = true
	// The context's end did not spoil the connection (stop reports that it had not fired),
	// the upstream did not ask to close it, its response is read to the end, and nothing
	// came after it: reuse it.
	if b.stop() && atEnd && b.keep && (b.chunks == nil || !b.chunks.over) {
		b.c.put(b.conn)
		return
	}
	b.conn.release()
	_ = b.conn.nc.Close()
}
