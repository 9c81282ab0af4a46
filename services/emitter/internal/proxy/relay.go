package proxy

import (
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// CodeMalformedGzip is the error code of a gzip-encoded body that does not decode.
const CodeMalformedGzip = "malformed_gzip"

var errClientGone = errors.New("the client went away")

// relay copies an upstream body to the client, flushing each piece as it arrives, while the
// meter reads it. How depends on the body's encoding:
//   - identity: the meter sees the bytes and returns what to forward (all of them, or all but
//     the usage chunk the proxy asked for);
//   - gzip, nothing to strip: the client gets the compressed bytes as they come, and the
//     meter reads a decompressed copy;
//   - gzip with the usage chunk to strip: the proxy decodes the stream and the client gets
//     it decoded, without the chunk (the caller removed Content-Encoding and Content-Length);
//   - another encoding: forwarded untouched and not measured.
type relay struct {
	out  client
	dog  *watchdog
	m    *meter.Meter
	bufs *sync.Pool // of *[]byte, each as long as its capacity
	bp   *[]byte    // the read buffer, taken from bufs while in use
	fp   *[]byte    // where the meter puts what to forward when it strips, the same way
	body upstreamBody
	// hold is where the stream may leave its goroutine, between two reads (flight.waitOrLeave):
	// it waits for the upstream if w is not nil, and reports whether it handed the stream off.
	hold func(w waiter) (handedOff bool)

	writeErr error // the client is gone
	badGzip  error // the body is not the gzip it says it is
}

// upstreamBody reads the response body, telling the watchdog about each byte that comes.
type upstreamBody struct {
	r   io.Reader
	dog *watchdog
	err error // how the body broke off, if it did
	eof bool
}

// waiter is a body that can wait for the upstream without a buffer of the reader's.
type waiter interface{ wait() error }

func (u *upstreamBody) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if n > 0 {
		u.dog.active(time.Now())
	}
	if err == io.EOF {
		u.eof = true
	} else if err != nil && u.err == nil {
		u.err = err
	}
	return n, err
}

// send writes p to the client and flushes it.
func (r *relay) send(p []byte) bool {
	// A client slow to read is not an upstream falling silent: the idle clock stops while
	// the client takes the bytes.
	r.dog.writing()
	err := r.out.send(p)
	r.dog.active(time.Now())
	if err != nil {
		r.writeErr = err
		return false
	}
	return true
}

// buf returns the read buffer.
func (r *relay) buf() []byte {
	if r.bp == nil {
		r.bp = r.bufs.Get().(*[]byte)
	}
	return *r.bp
}

// fwd returns the buffer the meter puts what to forward in, when it strips.
func (r *relay) fwd() []byte {
	if r.fp == nil {
		r.fp = r.bufs.Get().(*[]byte)
	}
	return (*r.fp)[:0]
}

// release gives the buffers back.
func (r *relay) release() {
	if r.bp != nil {
		r.bufs.Put(r.bp)
		r.bp = nil
	}
	if r.fp != nil {
		r.bufs.Put(r.fp)
		r.fp = nil
	}
}

// measured copies src to the client through the meter, which holds back the usage chunk
// when it strips it. It returns the error that ended src, nil at its end. Reading the body
// itself, it waits for the upstream before taking a buffer when the body allows, so that an
// idle stream holds none. When hold hands the stream off, it returns at once, handedOff
// set, and touches nothing more: another goroutine calls it again to go on.
func (r *relay) measured(src io.Reader) (handedOff bool, err error) {
	w, _ := r.body.r.(waiter)
	own := src == io.Reader(&r.body) // not inside a decoder: the loop can stop and go on
	if !own {
		w = nil
	}
	for {
		if w != nil {
			// Nothing is held while the upstream is silent; between two reads that
			// follow each other, this is a few pool operations.
			r.release()
			r.m.Idle()
		}
		if own && r.hold != nil {
			if r.hold(w) {
				return true, nil
			}
		} else if w != nil {
			_ = w.wait() // an error shows in the Read that follows
		}
		buf := r.buf()
		n, err := src.Read(buf)
		if n > 0 && !r.feed(buf[:n]) {
			return false, errClientGone
		}
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// maxKeptForward is the largest forward buffer kept for the next piece: one grown past it (an
// event past the meter's limit, forwarded at once) is let go.
const maxKeptForward = 64 << 10

// feed gives p to the meter and sends what it forwards; false: the client is gone.
func (r *relay) feed(p []byte) bool {
	var out []byte
	if r.m.Stripping() {
		out = r.m.Feed(p, time.Now(), r.fwd())
		if cap(out) <= maxKeptForward {
			*r.fp = out[:cap(out)] // grown, maybe: kept for the next piece, whole as in the pool
		}
	} else {
		out = r.m.Feed(p, time.Now(), nil)
	}
	r.dog.saw(r.m)
	return len(out) == 0 || r.send(out)
}

// raw copies the body to the client untouched and unmeasured.
func (r *relay) raw() {
	buf := r.buf()
	for {
		n, err := r.body.Read(buf)
		if n > 0 {
			r.dog.begun.Store(true) // unmeasured: its first byte is all there is to see
		}
		if n > 0 && !r.send(buf[:n]) {
			return
		}
		if err != nil {
			return
		}
	}
}

// gunzipped runs the body through zr, the client getting the decoded bytes (decode) or the
// bytes as they came (!decode).
func (r *relay) gunzipped(zr *gzip.Reader, decode bool) {
	var src io.Reader = &r.body
	if !decode {
		src = teeToClient{r}
	}
	err := zr.Reset(src)
	if err == io.EOF {
		return // an empty body
	}
	if err == nil {
		if decode {
			_, err = r.measured(zr)
		} else {
			buf := r.buf()
			for err == nil {
				var n int
				n, err = zr.Read(buf)
				if n > 0 {
					r.m.Feed(buf[:n], time.Now(), nil)
					r.dog.saw(r.m)
				}
			}
			if err == io.EOF {
				err = nil
			}
		}
	}
	if err != nil && r.body.err == nil && r.writeErr == nil {
		// Not the upstream breaking off, nor the client leaving: the data is not gzip.
		r.badGzip = err
		if !decode {
			r.raw() // the client still gets every byte
		}
	}
}

// teeToClient forwards what the gzip reader reads, as it reads it.
type teeToClient struct{ r *relay }

func (t teeToClient) Read(p []byte) (int, error) {
	n, err := t.r.body.Read(p)
	if n > 0 && !t.r.send(p[:n]) {
		return 0, errClientGone
	}
	return n, err
}

// tail sends what the meter held back when the body ended.
func (r *relay) tail(end time.Time) {
	if r.writeErr != nil {
		return
	}
	if rest := r.m.Flush(end, r.fwd()); len(rest) > 0 {
		r.send(rest)
	}
}

// encoding is how the proxy handles a response body's Content-Encoding.
type encoding uint8

const (
	identity encoding = iota
	gzipped
	other
)

func contentEncoding(h http.Header) encoding {
	switch enc := h.Get("Content-Encoding"); {
	case isIdentity(enc):
		return identity
	case strings.EqualFold(enc, "gzip") || strings.EqualFold(enc, "x-gzip"):
		return gzipped
	}
	return other
}

// decodableEncodings narrows a client's Accept-Encoding to what the proxy can decode, for the
// requests whose stream it must edit: gzip if the client takes it, identity otherwise. A
// request without the header gets identity too: an upstream may answer it in any coding
// (RFC 9110, 12.5.3), br say, which the proxy could not strip.
func decodableEncodings(h http.Header) {
	for _, v := range h.Values("Accept-Encoding") {
		for _, c := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(strings.TrimSpace(c), ";")
			if strings.EqualFold(strings.TrimSpace(name), "gzip") && !zeroQ(params) {
				h.Set("Accept-Encoding", "gzip")
				return
			}
		}
	}
	h.Set("Accept-Encoding", "identity")
}

// zeroQ reports whether a coding's parameters say q=0, "not acceptable".
func zeroQ(params string) bool {
	_, q, ok := strings.Cut(strings.ReplaceAll(params, " ", ""), "q=")
	if !ok {
		return false
	}
	return strings.Trim(q, "0.") == ""
}
