package proxy

import (
	"errors"
	"io"
)

// chunked decodes a body in the chunked transfer coding in place: it reads the raw bytes into
// the caller's buffer and moves the data to its front. It holds no buffer of its own, only
// where it is in the framing, so that a stream waiting for its upstream holds none at all.
// It accepts what net/http's chunked reader accepts: CRLF line ends only, at most 16 hex
// digits, whitespace after them only at the line's end, extensions skipped, lines shorter than
// 4 KB, framing overhead bounded against the data; and trailers, skipped, of up to 4 KB.
type chunked struct {
	src    io.Reader
	state  uint8
	size   uint64 // of the chunk whose size line is being read
	left   uint64 // data bytes left in the current chunk
	digits int
	line   int   // bytes of the current size or trailer line so far
	excess int64 // framing beyond what the data justifies, as net/http counts it
	over   bool  // bytes came after the body's end: the connection cannot serve another
	err    error // sticky: io.EOF at the end
}

// The states of the framing, one byte at a time.
const (
	chunkSize    uint8 = iota // the size's hex digits
	chunkSizeOWS              // whitespace after them
	chunkExt                  // an extension, skipped
	chunkSizeLF               // the LF after the size line's CR
	chunkData                 // left bytes of data
	chunkDataCR               // the CRLF after the data
	chunkDataLF
	trailerStart // a trailer line, or the empty line that ends the body
	trailerLine  // a trailer line, skipped to its LF
	trailerEndLF // the LF of the empty line
	chunkDone
)

const (
	maxChunkLine   = 4096 // as net/http's maxLineLength
	maxTrailer     = 4096 // as the bufio.Reader net/http's trailers must fit in
	maxChunkExcess = 16 << 10
)

var (
	errChunkLineTooLong = errors.New("chunk size line too long")
	errChunkSize        = errors.New("invalid chunk size")
	errChunkSizeTooBig  = errors.New("chunk size too large")
	errChunkBareLF      = errors.New("chunked line ends with bare LF")
	errChunkCR          = errors.New("invalid CR in chunked line")
	errChunkEnd         = errors.New("malformed chunked encoding")
	errChunkOverhead    = errors.New("chunked encoding contains too much non-data")
	errTrailerTooLong   = errors.New("trailer too long after chunked body")
)

// Read reads the next data of the body into p, from one read of the source. When that read
// brings only framing (the end of a chunk, the next size line), Read returns 0 and no error
// rather than read again: its caller then waits for the connection without a buffer
// (relay.measured) instead of blocking in Read with the caller's.
func (c *chunked) Read(p []byte) (int, error) {
	if c.err != nil || len(p) == 0 {
		return 0, c.err
	}
	m, err := c.src.Read(p)
	n := c.decode(p[:m])
	if err != nil && c.err == nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		c.err = err
	}
	return n, c.err
}

// decode decodes the raw bytes b in place and returns how many data bytes it moved to b's front.
func (c *chunked) decode(b []byte) int {
	w, i := 0, 0
	for i < len(b) && c.err == nil {
		if c.state == chunkData {
			k := min(uint64(len(b)-i), c.left)
			w += copy(b[w:], b[i:i+int(k)])
			i += int(k)
			if c.left -= k; c.left == 0 {
				c.state = chunkDataCR
			}
			continue
		}
		c.frame(b[i])
		i++
	}
	if i < len(b) && c.state == chunkDone {
		c.over = true
	}
	return w
}

// frame reads one byte of framing.
func (c *chunked) frame(ch byte) {
	switch c.state {
	case chunkSize, chunkSizeOWS, chunkExt:
		if ch == '\r' {
			break
		}
		if c.line++; c.line >= maxChunkLine {
			c.err = errChunkLineTooLong
			return
		}
	case trailerStart, trailerLine:
		if c.line++; c.line > maxTrailer {
			c.err = errTrailerTooLong
			return
		}
	}
	switch c.state {
	case chunkSize:
		switch {
		case hexDigit(ch) >= 0:
			if c.digits++; c.digits > 16 {
				c.err = errChunkSizeTooBig
				return
			}
			c.size = c.size<<4 | uint64(hexDigit(ch))
		case c.digits == 0:
			c.err = errChunkSize
		case ch == ';':
			c.state = chunkExt
		case ch == ' ' || ch == '\t':
			c.state = chunkSizeOWS
		case ch == '\r':
			c.state = chunkSizeLF
		case ch == '\n':
			c.err = errChunkBareLF
		default:
			c.err = errChunkSize
		}
	case chunkSizeOWS:
		switch ch {
		case ' ', '\t':
		case '\r':
			c.state = chunkSizeLF
		case '\n':
			c.err = errChunkBareLF
		default: // net/http trims whitespace at the line's end only
			c.err = errChunkSize
		}
	case chunkExt:
		switch ch {
		case '\r':
			c.state = chunkSizeLF
		case '\n':
			c.err = errChunkBareLF
		}
	case chunkSizeLF:
		if ch != '\n' {
			c.err = errChunkCR
			return
		}
		c.sizeLine()
	case chunkDataCR:
		if ch != '\r' {
			c.err = errChunkEnd
			return
		}
		c.state = chunkDataLF
	case chunkDataLF:
		if ch != '\n' {
			c.err = errChunkEnd
			return
		}
		c.state, c.line, c.digits, c.size = chunkSize, 0, 0, 0
	case trailerStart:
		switch ch {
		case '\r':
			c.state = trailerEndLF
		default:
			c.state = trailerLine
		}
	case trailerLine:
		if ch == '\n' {
			c.state = trailerStart
		}
	case trailerEndLF:
		if ch != '\n' {
			c.state = trailerLine // a trailer line that starts with a CR
			return
		}
		c.state, c.err = chunkDone, io.EOF
	}
}

// sizeLine ends a size line: a chunk of data follows, or the trailers.
func (c *chunked) sizeLine() {
	// A sender may send a byte per chunk, but not pad the framing without bound (net/http).
	c.excess += int64(c.line) + 2
	c.excess = max(c.excess-16-2*int64(min(c.size, 1<<40)), 0)
	if c.excess > maxChunkExcess {
		c.err = errChunkOverhead
		return
	}
	c.line = 0
	if c.size == 0 {
		c.state = trailerStart
		return
	}
	c.state, c.left = chunkData, c.size
}

func hexDigit(ch byte) int {
	switch {
	case '0' <= ch && ch <= '9':
		return int(ch - '0')
	case 'a' <= ch && ch <= 'f':
		return int(ch-'a') + 10
	case 'A' <= ch && ch <= 'F':
		return int(ch-'A') + 10
	}
	return -1
}
