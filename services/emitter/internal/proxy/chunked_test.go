package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
)

// decodeChunked reads body whole through chunked, in reads of at most step raw bytes.
func decodeChunked(body string, step int) (string, bool, error) {
	var src io.Reader = strings.NewReader(body)
	if step > 0 {
		src = &stepReader{r: src, n: step}
	}
	c := &chunked{src: src}
	var out bytes.Buffer
	buf := make([]byte, 64)
	for range 1 << 20 {
		n, err := c.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.String(), c.over, nil
		}
		if err != nil {
			return out.String(), c.over, err
		}
	}
	return out.String(), c.over, errors.New("no progress")
}

// stepReader reads at most n bytes at a time.
type stepReader struct {
	r io.Reader
	n int
}

func (s *stepReader) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.n)]) }

func TestChunked(t *testing.T) {
	f := func(body, want string, wantErr error, over bool) {
		t.Helper()
		for _, step := range []int{0, 1, 3} { // whole, byte by byte, and split frames
			got, gotOver, err := decodeChunked(body, step)
			if (wantErr == nil) != (err == nil) || (wantErr != nil && !errors.Is(err, wantErr)) {
				t.Fatalf("%q (step %d): error %v, want %v", body, step, err, wantErr)
			}
			// Read whole, the bytes after the body came with it; read by pieces, they may not.
			if err == nil && (got != want || (step == 0 && gotOver != over)) {
				t.Fatalf("%q (step %d): %q over=%v, want %q over=%v", body, step, got, gotOver, want, over)
			}
		}
	}
	f("3\r\nabc\r\n0\r\n\r\n", "abc", nil, false)
	f("3\r\nabc\r\n1A\r\n"+strings.Repeat("x", 26)+"\r\n0\r\n\r\n", "abc"+strings.Repeat("x", 26), nil, false)
	f("3;ext=1;b=\"q\"\r\nabc\r\n0;last\r\n\r\n", "abc", nil, false)
	f("3  \t\r\nabc\r\n0\r\n\r\n", "abc", nil, false) // whitespace before the line's end
	f("003\r\nabc\r\n0\r\n\r\n", "abc", nil, false)
	f("3\r\nabc\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n", "abc", nil, false)
	f("0\r\n\r\n", "", nil, false)
	f("3\r\nabc\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", "abc", nil, true) // bytes after the body
	f("3\nabc\r\n0\r\n\r\n", "", errChunkBareLF, false)
	f("3\r\nabc\n0\r\n\r\n", "", errChunkEnd, false)
	f("3\r\nabcd\r\n0\r\n\r\n", "", errChunkEnd, false)
	f("3;a\rb\r\nabc\r\n0\r\n\r\n", "", errChunkCR, false)
	f("\r\nabc\r\n0\r\n\r\n", "", errChunkSize, false)
	f("g\r\n", "", errChunkSize, false)
	f(" 3\r\nabc\r\n", "", errChunkSize, false)
	f("3 ;x\r\nabc\r\n", "", errChunkSize, false) // net/http trims whitespace at the end only
	f("3 x\r\nabc\r\n", "", errChunkSize, false)
	f("11111111111111111\r\n", "", errChunkSizeTooBig, false)
	f("3;"+strings.Repeat("e", maxChunkLine)+"\r\nabc\r\n", "", errChunkLineTooLong, false)
	f("3\r\nabc\r\n0\r\n"+strings.Repeat("T: x\r\n", maxTrailer/6+1)+"\r\n", "", errTrailerTooLong, false)
	f(strings.Repeat("1;"+strings.Repeat("e", 500)+"\r\nx\r\n", 40), "", errChunkOverhead, false)
	f("3\r\nab", "", io.ErrUnexpectedEOF, false)
	f("3\r\nabc\r\n", "", io.ErrUnexpectedEOF, false)
	f("3\r\nabc\r\n0\r\n", "", io.ErrUnexpectedEOF, false)
}

// TestChunkedFramingOnlyRead: a read that brings only framing returns at once, with nothing
// and no error, rather than wait for data with the caller's buffer.
func TestChunkedFramingOnlyRead(t *testing.T) {
	c := &chunked{src: iotest.OneByteReader(strings.NewReader("3\r\nabc\r\n"))}
	n, err := c.Read(make([]byte, 8))
	if n != 0 || err != nil {
		t.Fatalf("%d, %v", n, err)
	}
}

// FuzzChunked checks the decoder against net/http's: a body net/http reads whole, the decoder
// reads to the same bytes; and what the decoder accepts, net/http accepts, but trailers,
// which the decoder skips unparsed.
func FuzzChunked(f *testing.F) {
	for _, s := range []string{"3\r\nabc\r\n0\r\n\r\n", "1;x\r\na\r\n0\r\nT: 1\r\n\r\n", "3 \r\nabc\r\n0\r\n\r\n", "3\nabc\r\n0\r\n\r\n", "0\r\n\r\nxyz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		resp, err := http.ReadResponse(bufio.NewReaderSize(strings.NewReader("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"+body), 64<<10), nil)
		if err != nil {
			t.Fatal(err)
		}
		theirs, theirErr := io.ReadAll(resp.Body)
		ours, _, ourErr := decodeChunked(body, 7)
		if theirErr == nil && (ourErr != nil || ours != string(theirs)) {
			t.Fatalf("net/http read %q; the decoder %q, %v", theirs, ours, ourErr)
		}
		_, trailers, _ := strings.Cut(body, "\r\n0\r\n")
		if ourErr == nil && theirErr != nil && !strings.HasPrefix(body, "0") && trailers == "\r\n" {
			t.Fatalf("the decoder read %q; net/http failed: %v", ours, theirErr)
		}
	})
}
