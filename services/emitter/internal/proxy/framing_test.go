package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

func chunkedBody(s string) string {
	return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(s), s)
}

// smuggled is a request a proxy in front that framed the one before by its Content-Length
// would have taken for that one's body.
const smuggled = "GET /v1/smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

// TestAmbiguousFramingClosesTheConnection: a head with Content-Length and Transfer-Encoding,
// or with an obs-folded Transfer-Encoding, is answered (read as chunked, as net/http reads it)
// with Connection: close and its connection closed after the answer, so the bytes behind it
// never reach the upstream as a request; an HTTP/1.0 head with Transfer-Encoding is refused
// with 400 and nothing of it goes upstream. Each is counted. Heads framed one way only keep
// their connection, pipelined or not, chunked or not.
func TestAmbiguousFramingClosesTheConnection(t *testing.T) {
	chat := chatBody(false, "")
	for _, tc := range []struct {
		name, head, body string
		wantStatus       int
		wantProblem      string // "" for a head framed one way only
		wantLines        []string
	}{
		{name: "content length and chunked", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
			body: chunkedBody(chat), wantStatus: 200, wantProblem: framingCLAndTE, wantLines: []string{"POST /v1/chat/completions HTTP/1.1"}},
		{name: "chunked and content length", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\ncontent-length: 4\r\n\r\n",
			body: chunkedBody(chat), wantStatus: 200, wantProblem: framingCLAndTE, wantLines: []string{"POST /v1/chat/completions HTTP/1.1"}},
		{name: "folded transfer encoding", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n",
			body: chunkedBody(chat), wantStatus: 200, wantProblem: framingFolded, wantLines: []string{"POST /v1/chat/completions HTTP/1.1"}},
		{name: "folded content length", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n " + fmt.Sprint(len(chat)) + "\r\n\r\n",
			body: chat, wantStatus: 200, wantProblem: framingFolded, wantLines: []string{"POST /v1/chat/completions HTTP/1.1"}},
		{name: "HTTP/1.0 chunked", head: "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
			body: chunkedBody(chat), wantStatus: 400, wantProblem: framingTEHTTP10},
		{name: "HTTP/1.0 chunked with a length", head: "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: " + fmt.Sprint(len(chat)) + "\r\nTransfer-Encoding: chunked\r\n\r\n",
			body: chat, wantStatus: 400, wantProblem: framingTEHTTP10},

		{name: "content length", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + fmt.Sprint(len(chat)) + "\r\n\r\n",
			body: chat, wantStatus: 200, wantLines: []string{"POST /v1/chat/completions HTTP/1.1", "GET /v1/smuggled HTTP/1.1"}},
		{name: "chunked", head: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
			body: chunkedBody(chat), wantStatus: 200, wantLines: []string{"POST /v1/chat/completions HTTP/1.1", "GET /v1/smuggled HTTP/1.1"}},
		{name: "HTTP/1.0 with a length", head: "POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: " + fmt.Sprint(len(chat)) + "\r\n\r\n",
			body: chat, wantStatus: 200, wantLines: []string{"POST /v1/chat/completions HTTP/1.1", "GET /v1/smuggled HTTP/1.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newLineRecorder(t, "")
			p, _, _ := newTestProxy(t, up.url, nil)
			srv := serveProxy(t, p, nil, nil)
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(conn, tc.head+tc.body+smuggled); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("status %d %s, want %d", resp.StatusCode, body, tc.wantStatus)
			}
			if tc.wantProblem == "" {
				// The next request on the connection is answered.
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatalf("the next request on the connection: %v", err)
				}
				resp.Body.Close()
			} else {
				if !resp.Close {
					t.Fatalf("answered without Connection: close: %v", resp.Header)
				}
				if tc.wantStatus == 400 && !strings.Contains(string(body), "HTTP/1.0 request cannot have Transfer-Encoding") {
					t.Fatalf("refused with %q", body)
				}
				// The connection closes after the answer: nothing more comes.
				if n, err := br.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
					t.Fatalf("after the answer: %d bytes, %v; want the connection closed", n, err)
				}
			}
			var lines []string
			for range tc.wantLines {
				select {
				case l := <-up.lines:
					lines = append(lines, l)
				case <-time.After(5 * time.Second):
				}
			}
			select {
			case l := <-up.lines:
				lines = append(lines, l)
			case <-time.After(100 * time.Millisecond):
			}
			if strings.Join(lines, "|") != strings.Join(tc.wantLines, "|") {
				t.Fatalf("the upstream got %q, want %q", lines, tc.wantLines)
			}
			if n := testutil.ToFloat64(p.m.framing.WithLabelValues(framingCLAndTE)) + testutil.ToFloat64(p.m.framing.WithLabelValues(framingFolded)) +
				testutil.ToFloat64(p.m.framing.WithLabelValues(framingTEHTTP10)) + testutil.ToFloat64(p.m.framing.WithLabelValues(framingUnfollowed)); n != boolFloat(tc.wantProblem != "") ||
				(tc.wantProblem != "" && testutil.ToFloat64(p.m.framing.WithLabelValues(tc.wantProblem)) != 1) {
				t.Fatalf("ambiguous_framing_total: %v in all, want 1 of %q", n, tc.wantProblem)
			}
		})
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// chunkConn returns its input in reads of random sizes.
type chunkConn struct {
	net.Conn
	in  []byte
	rnd *rand.Rand
}

func (c *chunkConn) Read(p []byte) (int, error) {
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), 1+c.rnd.IntN(len(c.in)), len(c.in))
	copy(p, c.in[:n])
	c.in = c.in[n:]
	return n, nil
}

func (c *chunkConn) SetReadDeadline(time.Time) error { return nil }

// readAllThrough reads in through a framingConn, the underlying reads and the caller's
// buffers of random sizes.
func readAllThrough(t *testing.T, in []byte, seed uint64) ([]byte, *framingConn) {
	t.Helper()
	rnd := rand.New(rand.NewPCG(seed, seed))
	fc := &framingConn{Conn: &chunkConn{in: in, rnd: rnd}, lineStart: true,
		problems: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"problem"})}
	var out []byte
	for {
		p := make([]byte, 1+rnd.IntN(64))
		n, err := fc.Read(p)
		out = append(out, p[:n]...)
		if err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			return out, fc
		}
	}
}

// TestFramingConnPassesRequestsThrough: requests framed one way only reach net/http byte for
// byte, whatever the reads' sizes; an ambiguous head gets Connection: close, and the bytes
// after it still follow; an HTTP/1.0 head with Transfer-Encoding, and what follows it, does
// not reach net/http.
func TestFramingConnPassesRequestsThrough(t *testing.T) {
	long := strings.Repeat("x", 5000)
	clean := "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" +
		"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: T\r\n\r\n5;ext=1\r\nhello\r\n1388\r\n" + long + "\r\n0\r\nT: v\r\n\r\n" +
		"GET /c HTTP/1.1\nHost: x\nX-Long: " + long + "\n\n" +
		"\r\n" + // an empty line between requests
		"POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" +
		"POST /e HTTP/1.0\r\nContent-Length: 3\r\n\r\n\r\n\r\n" +
		"POST /f HTTP/1.1\r\nHost: x\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\n\n\n" + smuggled
	ambiguous := "POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
	for seed := range uint64(200) {
		if out, fc := readAllThrough(t, []byte(clean), seed); string(out) != clean || testutil.CollectAndCount(fc.problems) != 0 {
			t.Fatalf("seed %d: net/http got\n%q\nwant\n%q", seed, out, clean)
		}
		in := clean + ambiguous + chunkedBody("abc") + smuggled
		want := clean + strings.Replace(ambiguous, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1) + chunkedBody("abc") + smuggled
		if out, fc := readAllThrough(t, []byte(in), seed); string(out) != want || testutil.ToFloat64(fc.problems.WithLabelValues(framingCLAndTE)) != 1 {
			t.Fatalf("seed %d: net/http got\n%q\nwant\n%q", seed, out, want)
		}
		in = clean + "POST /h HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunkedBody("abc") + smuggled
		if out, fc := readAllThrough(t, []byte(in), seed); string(out) != clean || !fc.refuse.Load() {
			t.Fatalf("seed %d: net/http got\n%q\nwant\n%q", seed, out, clean)
		}
	}
}

// TestFramingConnRefusalAnswered: the refusal goes out when net/http closes the connection.
func TestFramingConnRefusalAnswered(t *testing.T) {
	client, server := net.Pipe()
	fc := &framingConn{Conn: server, lineStart: true, problems: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"problem"})}
	go func() { _, _ = io.WriteString(client, "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") }()
	if n, err := fc.Read(make([]byte, 4096)); n != 0 || err != io.EOF {
		t.Fatalf("read %d, %v; want EOF", n, err)
	}
	got := make(chan string)
	go func() { b, _ := io.ReadAll(client); got <- string(b) }()
	_ = fc.Close()
	if b := <-got; b != refusalHTTP10 {
		t.Fatalf("answered %q", b)
	}
}

// TestDetachedAmbiguousFraming: a stream asked for with an ambiguous framing, taken over by
// the proxy, closes its connection after the stream, as net/http would; what came behind it
// is never served.
func TestDetachedAmbiguousFraming(t *testing.T) {
	r := newDetachRig(t, fakellm.New(fakellm.Options{}), nil)
	conn, err := net.Dial("tcp", r.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nX-Fakellm-TPOT: 10ms\r\nX-Fakellm-Tokens: 10\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n%s%s",
		chatPath, chunkedBody(chatBody(true, "")), smuggled)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || !resp.Close || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("close %v, %v, %q", resp.Close, err, b)
	}
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the stream: %d bytes, %v; want the connection closed", n, err)
	}
	if r.hijacked.Load() != 1 {
		t.Fatal("the stream was not detached")
	}
	r.cap.next(t)
}

// FuzzFramingConn: whatever the bytes and the reads' sizes, the conn does not fail, and it
// changes nothing of a connection on which it found no problem.
func FuzzFramingConn(f *testing.F) {
	f.Add([]byte("POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n"), uint64(1))
	f.Add([]byte("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nT: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n"), uint64(2))
	f.Add([]byte("POST /a HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), uint64(3))
	f.Add([]byte("POST /a HTTP/1.0\r\nTransfer-Encoding:\r\n chunked\r\n\r\n"), uint64(4))
	f.Add([]byte("\x16\x03\x01\x02\x00"), uint64(5))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		out, fc := readAllThrough(t, in, seed)
		var problems float64
		for _, p := range framingProblems {
			problems += testutil.ToFloat64(fc.problems.WithLabelValues(p))
		}
		if problems == 0 && string(out) != string(in) {
			t.Fatalf("no problem found, and net/http got\n%q\nof\n%q", out, in)
		}
	})
}

// parseRequests reads b as net/http's server reads requests, each with its body, and
// describes them: the Connection field aside, and its close, which say where a server stops.
func parseRequests(b []byte) (reqs []string, closes []bool) {
	br := bufio.NewReader(bytes.NewReader(b))
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return reqs, closes
		}
		body, err := io.ReadAll(req.Body)
		closes = append(closes, req.Close)
		req.Header.Del("Connection")
		reqs = append(reqs, fmt.Sprintf("%s %s %s %v %v %q %v", req.Method, req.RequestURI, req.Proto, req.Header, req.Trailer, body, err))
		if err != nil {
			return reqs, closes
		}
	}
}

// FuzzFramingConnFollowsNetHTTP: net/http reads the same requests through the conn as from
// the bytes themselves, up to the last one the server would answer on the connection (the
// first that asks to close it, as a changed head does, or the last before a refused head).
func FuzzFramingConnFollowsNetHTTP(f *testing.F) {
	f.Add([]byte("POST /a HTTP/1.1\r\nContent-Length: 2\r\n\r\nhiGET / HTTP/1.1\r\n\r\n"), uint64(1))
	f.Add([]byte("POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nT: 1\r\n\r\nGET / HTTP/1.1\r\n\r\n"), uint64(2))
	f.Add([]byte("POST /a HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\n\r\n"), uint64(3))
	f.Add([]byte("GET /a HTTP/1.1\r\n\r\nPOST /a HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\n\r\n"), uint64(4))
	f.Add([]byte("POST /a HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\nGET /b HTTP/1.1\r\n\r\n"), uint64(5))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		out, fc := readAllThrough(t, in, seed)
		want, _ := parseRequests(in)
		got, closes := parseRequests(out)
		last := len(got) - 1
		for i, c := range closes {
			if c {
				last = i
				break
			}
		}
		if fc.refuse.Load() {
			last = len(got) - 1 // everything before the refused head, and nothing of it
		}
		for i := 0; i <= last; i++ {
			if i >= len(want) || got[i] != want[i] {
				t.Fatalf("request %d through the conn:\n%v\nfrom the bytes:\n%v\n(in %q)", i, got, want, in)
			}
		}
	})
}

// BenchmarkFramingConn: the cost of following one kept-alive request, its head and its body
// in one read.
func BenchmarkFramingConn(b *testing.B) {
	body := chatBody(true, "")
	req := []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: OpenAI/Python 1.55.0\r\nAccept: application/json\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-test\r\nX-Tokenscope-Scene: chat\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	fc := &framingConn{lineStart: true, problems: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x"}, []string{"problem"})}
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		if n := fc.feed(req); n != len(req) || fc.st != framingHead {
			b.Fatalf("released %d of %d", n, len(req))
		}
	}
}
