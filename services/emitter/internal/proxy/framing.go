package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

// Request heads whose framing a server and a proxy in front of it could read differently
// (RFC 9112, 6.1 and 11.2). net/http reads each of them one way, but deletes the fields before
// a handler could see them and keeps the connection open, so that bytes a proxy in front took
// for this request's body would be read here as the next request (request smuggling).
const (
	// Content-Length and Transfer-Encoding both: read as chunked, the connection closed after
	// the answer.
	framingCLAndTE = "content_length_and_transfer_encoding"
	// Transfer-Encoding or Content-Length continued on an obs-fold line: the same.
	framingFolded = "folded_framing_field"
	// HTTP/1.0 with Transfer-Encoding: refused with 400, the connection closed.
	framingTEHTTP10 = "transfer_encoding_http10"
	// A head whose framing this conn cannot follow (net/http refuses such a request, or
	// frames it in a way that is not followed here): the connection closed after the answer.
	framingUnfollowed = "unfollowed"
)

var framingProblems = []string{framingCLAndTE, framingFolded, framingTEHTTP10, framingUnfollowed}

// maxHead bounds a request head a framingConn holds: the server's MaxHeaderBytes with the
// slack net/http allows. net/http refuses a longer one.
const maxHead = ops.MaxHeaderBytes + 4096

// refusalHTTP10 is the answer to an HTTP/1.0 head with Transfer-Encoding.
var refusalHTTP10 = func() string {
	const body = "an HTTP/1.0 request cannot have Transfer-Encoding (RFC 9112, section 6.1)\n"
	return "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// framingListener wraps each connection it accepts in a framingConn.
type framingListener struct {
	net.Listener
	problems *prometheus.CounterVec
}

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &framingConn{Conn: c, problems: l.problems, lineStart: true}, nil
}

// framingConn follows the requests on a client's connection as net/http reads them, head by
// head and body by body, framed as net/http frames them, to act on the heads above: it adds
// "Connection: close" to a head whose framing is ambiguous, so that net/http, and the proxy
// for a stream it takes over, closes the connection after the answer; and it ends the
// connection before an HTTP/1.0 head with Transfer-Encoding reaches net/http, answering 400
// once net/http has let go of it. Bodies pass through in place; only a head that does not
// come whole in one read, or that is changed, is copied. A connection whose framing it
// cannot follow is closed after the answer, and from that head on it looks no more.
type framingConn struct {
	net.Conn
	problems *prometheus.CounterVec

	st        framingState
	left      int64   // of a Content-Length body
	chunk     chunked // the framing of a chunked body (its src is unused)
	head      []byte  // a head not yet whole
	lineStart bool    // the head scan is at the start of a line
	lineCR    bool    // and has seen a CR there
	out       []byte  // bytes for net/http the conn holds: a head it changed or held, and what followed
	err       error   // the read error that came with the last bytes, for after them

	refuse  atomic.Bool // an HTTP/1.0 head with Transfer-Encoding came: net/http gets EOF, Close answers
	refusal sync.Once
}

type framingState uint8

const (
	framingHead    framingState = iota // between requests, or in a head
	framingBody                        // in a Content-Length body
	framingChunked                     // in a chunked body
	framingLost                        // passing bytes through without looking
)

// held reports whether the conn holds bytes for net/http that the socket no longer has: a
// connection given back after a stream must then go to net/http at once rather than wait
// for the socket to become readable (listener.giveBack).
func (c *framingConn) held() bool { return len(c.out) > 0 || c.refuse.Load() }

func (c *framingConn) Read(p []byte) (int, error) {
	for {
		if len(c.out) > 0 {
			n := copy(p, c.out)
			if c.out = c.out[n:]; len(c.out) == 0 {
				c.out = nil
			}
			return n, nil
		}
		if c.refuse.Load() {
			return 0, io.EOF // to net/http the client is gone; Close answers it
		}
		if c.err != nil {
			if len(c.head) > 0 { // the client's last bytes: net/http sees what it would have
				c.out, c.head = c.head, nil
				continue
			}
			return 0, c.err
		}
		n, err := c.Conn.Read(p)
		if n == 0 && err != nil && len(c.head) > 0 && !errors.Is(err, os.ErrDeadlineExceeded) {
			c.err = err
			continue
		}
		if n == 0 || c.st == framingLost {
			return n, err
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			c.err = err // after the bytes; a deadline is net/http's to set again
		}
		if k := c.feed(p[:n]); k > 0 {
			return k, nil
		}
	}
}

// feed follows b, just read, and returns how many of its first bytes net/http gets as they
// are; the conn took the rest into head or out.
func (c *framingConn) feed(b []byte) int {
	taking := len(c.head) > 0 // a head is under way: b continues it
	rel := 0
	let := func(from, to int) {
		if taking {
			c.out = append(c.out, b[from:to]...)
		} else {
			rel = to
		}
	}
	for i := 0; i < len(b); {
		switch c.st {
		case framingLost:
			let(i, len(b))
			i = len(b)
		case framingBody:
			k := int(min(int64(len(b)-i), c.left))
			if c.left -= int64(k); c.left == 0 {
				c.st = framingHead
			}
			let(i, i+k)
			i += k
		case framingChunked:
			k := c.chunk.skip(b[i:])
			if c.chunk.state == chunkDone {
				c.st = framingHead
			} else if c.chunk.err != nil {
				// net/http refuses the body too, and closes the connection.
				c.st = framingLost
			}
			let(i, i+k)
			i += k
		case framingHead:
			if len(c.head) == 0 && c.lineStart && !c.lineCR && !startsRequest(b[i]) {
				// Not HTTP/1 (TLS, say, under a TLS listener): nothing to follow.
				c.st = framingLost
				continue
			}
			end := c.headEnd(b[i:])
			if end < 0 {
				if len(c.head)+len(b)-i > maxHead {
					// net/http refuses it too, and closes the connection.
					c.st = framingLost
					c.out = append(c.out, c.head...)
					c.head = nil
					continue
				}
				c.head = append(c.head, b[i:]...)
				taking = true
				return rel
			}
			head := b[i : i+end]
			if len(c.head) > 0 {
				head = append(c.head, head...)
				c.head = nil
			}
			problem := c.judge(head)
			switch problem {
			case "":
				if taking {
					c.out = append(c.out, head...)
				} else {
					rel = i + end
				}
			case framingTEHTTP10:
				c.problems.WithLabelValues(problem).Inc()
				c.refuse.Store(true)
				return rel
			default:
				c.problems.WithLabelValues(problem).Inc()
				taking = true
				c.out = withClose(c.out, head)
			}
			i += end
		}
	}
	return rel
}

// headEnd returns the length of the head that b ends, with what the conn holds of it, or -1
// when b does not end it: the head ends with its first empty line (CRLF or a bare LF, as
// textproto reads lines).
func (c *framingConn) headEnd(b []byte) int {
	for i := 0; i < len(b); {
		if c.lineStart {
			switch ch := b[i]; {
			case ch == '\n':
				c.lineCR = false
				return i + 1 // lineStart stays: the next head starts a line
			case ch == '\r' && !c.lineCR:
				c.lineCR = true
				i++
				continue
			}
			c.lineStart, c.lineCR = false, false
		}
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return -1
		}
		i += j + 1
		c.lineStart = true
	}
	return -1
}

// judge reads a whole head, sets how the body that follows it is framed, and returns the
// problem with its framing, if any. It frames the body as net/http does: for HTTP/1.1, by a
// Transfer-Encoding of exactly "chunked" (any other net/http refuses), else by a
// Content-Length; for HTTP/1.0, by a Content-Length, Transfer-Encoding ignored.
func (c *framingConn) judge(head []byte) string {
	var (
		requestLine, http10, folded bool
		te, cl                      int
		teValue, clValue            []byte
		clDiffer                    bool
		last                        int // the field of the previous line: 1 Transfer-Encoding, 2 Content-Length
	)
	for len(head) > 0 {
		var line []byte
		line, head, _ = bytes.Cut(head, []byte{'\n'})
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if !requestLine {
			if len(line) == 0 {
				return "" // net/http refuses an empty request line, and closes the connection
			}
			requestLine = true
			_, rest, _ := bytes.Cut(line, []byte{' '})
			_, proto, _ := bytes.Cut(rest, []byte{' '})
			if !bytes.HasPrefix(proto, []byte("HTTP/1.")) {
				// HTTP/2's preface, which net/http serves or refuses: no HTTP/1 follows.
				c.st = framingLost
				return ""
			}
			http10 = string(proto) == "HTTP/1.0"
			continue
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' { // obs-fold: net/http joins it to the line before
			switch last {
			case 1:
				folded, teValue = true, unfold(teValue, line)
			case 2:
				folded, clValue = true, unfold(clValue, line)
			}
			continue
		}
		name, value, _ := bytes.Cut(line, []byte{':'})
		switch {
		case len(name) != len("Transfer-Encoding") && len(name) != len("Content-Length"):
			last = 0
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			te++
			teValue, last = trimOWS(value), 1
		case bytes.EqualFold(name, []byte("Content-Length")):
			v := trimOWS(value)
			if cl++; cl > 1 && !bytes.Equal(v, clValue) {
				clDiffer = true
			}
			clValue, last = v, 2
		default:
			last = 0
		}
	}
	c.st = framingHead
	switch {
	case http10 && te > 0:
		return framingTEHTTP10
	case te > 0 && !http10:
		if te != 1 || !bytes.EqualFold(teValue, []byte("chunked")) {
			c.st = framingLost // net/http answers 501 and closes the connection
			return framingUnfollowed
		}
		c.st, c.chunk = framingChunked, chunked{}
	case cl > 0:
		n, err := strconv.ParseUint(string(clValue), 10, 63)
		if err != nil || clDiffer {
			c.st = framingLost // net/http answers 400 and closes the connection
			return framingUnfollowed
		}
		if n > 0 {
			c.st, c.left = framingBody, int64(n)
		}
	}
	switch {
	case te > 0 && cl > 0:
		return framingCLAndTE
	case folded:
		return framingFolded
	}
	return ""
}

// startsRequest reports whether ch can start a request head: a method's first character, or
// the empty line net/http tolerates before a request.
func startsRequest(ch byte) bool {
	return ch == '\r' || ch == '\n' || (ch < 0x80 && tokenChar[ch])
}

// withClose appends head to dst with "Connection: close" added before its empty line, so that
// net/http closes the connection after answering it.
func withClose(dst, head []byte) []byte {
	k := len(head) - 1 // the empty line's LF
	if k > 0 && head[k-1] == '\r' {
		k--
	}
	dst = append(dst, head[:k]...)
	dst = append(dst, "Connection: close\r\n"...)
	return append(dst, head[k:]...)
}

// Close answers a refused HTTP/1.0 head first: net/http is done with the connection.
func (c *framingConn) Close() error {
	c.answerRefusal()
	return c.Conn.Close()
}

// CloseWrite lets net/http close the connection gracefully, as it does a TCP one.
func (c *framingConn) CloseWrite() error {
	c.answerRefusal()
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

func (c *framingConn) answerRefusal() {
	if !c.refuse.Load() {
		return
	}
	c.refusal.Do(func() {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(c.Conn, refusalHTTP10)
	})
}

// SyscallConn lets the relay loop write to the socket and the watcher watch it.
func (c *framingConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("not a socket")
	}
	return sc.SyscallConn()
}

// skip follows the framing of b, the raw body, without decoding it, and returns how many of
// its bytes belong to the body: all of them, or up to the body's end or a framing error.
func (c *chunked) skip(b []byte) int {
	i := 0
	for i < len(b) && c.err == nil && c.state != chunkDone {
		if c.state == chunkData {
			k := min(uint64(len(b)-i), c.left)
			i += int(k)
			if c.left -= k; c.left == 0 {
				c.state = chunkDataCR
			}
			continue
		}
		c.frame(b[i])
		i++
	}
	return i
}

func trimOWS(b []byte) []byte { return bytes.Trim(b, " \t") }

// unfold joins a continuation line to a field's value as net/http does, with one space, in
// a new slice: the value may be in net/http's buffer.
func unfold(value, cont []byte) []byte {
	v := append(append(append([]byte(nil), value...), ' '), trimOWS(cont)...)
	return trimOWS(v)
}
