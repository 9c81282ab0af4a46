//go:build linux

package main

import (
	"bytes"
	"container/heap"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// The load generator of BenchmarkProxyAddedLatency: a fake OpenAI upstream and a streaming
// client, each one goroutine around epoll, as wrk and h2load are built. With net/http on both
// sides the harness took ~1.4 ms of CPU per pair of requests on this machine (a system call
// costs ~1.4 µs here), more than the proxy it measures, and saturated the two cores before
// 1,000 requests/s. Both paths, direct and through the proxy, use the same client and the
// same upstream, so the harness adds nothing to the difference.

// epollWait waits for events until timeout, which has the nanosecond resolution of
// epoll_pwait2 (Linux 5.11): the fake's token pacing must not round to milliseconds.
func epollWait(ep int, evs []syscall.EpollEvent, timeout time.Duration) (int, error) {
	ts := syscall.NsecToTimespec(int64(max(timeout, 0)))
	n, _, errno := syscall.Syscall6(441 /* SYS_EPOLL_PWAIT2 */, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), uintptr(unsafe.Pointer(&ts)), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// timer is a step due for one connection; gen tells a stale timer from a live one.
type timer struct {
	due time.Time
	fd  int
	gen uint64
}

type timers []timer

func (h timers) Len() int           { return len(h) }
func (h timers) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h timers) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timers) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timers) Pop() any          { old := *h; t := old[len(old)-1]; *h = old[:len(old)-1]; return t }

// chunk frames p as one HTTP/1.1 chunk.
func chunk(p []byte) []byte {
	out := strconv.AppendUint(nil, uint64(len(p)), 16)
	out = append(out, "\r\n"...)
	out = append(out, p...)
	return append(out, "\r\n"...)
}

// sseScript is what the fake sends for a chat stream, cut from fakellm's own output so the
// bytes are the product's fake LLM's: the opening event at once, a token after TTFT, one
// every TPOT, and the closing events with the last one.
type sseScript struct {
	open              []byte   // response head and the opening event
	tokens            [][]byte // one framed event each
	closeWithUsage    []byte   // finish, usage chunk, [DONE], last chunk
	closeWithoutUsage []byte
}

func newSSEScript(t testing.TB, tokens int) *sseScript {
	srv := httptest.NewServer(fakellm.New(fakellm.Options{Tokens: tokens}))
	defer srv.Close()
	capture := func(usage bool) [][]byte {
		body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"x"}]`
		if usage {
			body += `,"stream_options":{"include_usage":true}`
		}
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body+"}"))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var evs [][]byte
		for _, ev := range bytes.SplitAfter(raw, []byte("\n\n")) {
			if len(ev) > 0 {
				evs = append(evs, ev)
			}
		}
		if len(evs) < tokens+2 {
			t.Fatalf("fakellm sent %d events for %d tokens", len(evs), tokens)
		}
		return evs
	}
	with, without := capture(true), capture(false)
	s := &sseScript{open: []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")}
	s.open = append(s.open, chunk(with[0])...)
	for _, ev := range with[1 : 1+tokens] {
		s.tokens = append(s.tokens, chunk(ev))
	}
	for _, ev := range with[1+tokens:] {
		s.closeWithUsage = append(s.closeWithUsage, chunk(ev)...)
	}
	for _, ev := range without[1+tokens:] {
		s.closeWithoutUsage = append(s.closeWithoutUsage, chunk(ev)...)
	}
	s.closeWithUsage = append(s.closeWithUsage, "0\r\n\r\n"...)
	s.closeWithoutUsage = append(s.closeWithoutUsage, "0\r\n\r\n"...)
	return s
}

// fakeConn is one upstream connection of the fake: a request being read, or a stream going out.
type fakeConn struct {
	fd    int
	in    []byte
	out   []byte // what a full socket buffer left unsent
	step  int    // tokens sent; -1 while reading a request
	usage bool
	gen   uint64
}

// epollFake is a fake OpenAI chat upstream, streaming at fixed TTFT and TPOT, on keep-alive
// HTTP/1.1 connections.
type epollFake struct {
	ln, ep     int
	addr       string
	script     *sseScript
	ttft, tpot time.Duration
	conns      map[int]*fakeConn
	due        timers
	stop       atomic.Bool
	done       chan struct{}
	failures   atomic.Int64
}

func startEpollFake(t testing.TB, ttft, tpot time.Duration, tokens int) *epollFake {
	f := &epollFake{script: newSSEScript(t, tokens), ttft: ttft, tpot: tpot, conns: map[int]*fakeConn{}, done: make(chan struct{})}
	var err error
	if f.ln, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	_ = syscall.SetsockoptInt(f.ln, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(f.ln, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(f.ln, 4096); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(f.ln)
	if err != nil {
		t.Fatal(err)
	}
	f.addr = fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	if f.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if err := syscall.EpollCtl(f.ep, syscall.EPOLL_CTL_ADD, f.ln, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(f.ln)}); err != nil {
		t.Fatal(err)
	}
	go f.run()
	t.Cleanup(func() {
		f.stop.Store(true)
		<-f.done
		for fd := range f.conns {
			syscall.Close(fd)
		}
		syscall.Close(f.ln)
		syscall.Close(f.ep)
	})
	return f
}

func (f *epollFake) run() {
	defer close(f.done)
	evs := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	for !f.stop.Load() {
		wait := 50 * time.Millisecond
		if len(f.due) > 0 {
			wait = min(wait, time.Until(f.due[0].due))
		}
		n, err := epollWait(f.ep, evs, wait)
		if err != nil && !errors.Is(err, syscall.EINTR) {
			f.failures.Add(1)
			return
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == f.ln {
				f.accept()
				continue
			}
			c := f.conns[fd]
			if c == nil {
				continue
			}
			if ev.Events&syscall.EPOLLOUT != 0 && !f.flush(c) {
				continue
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR|syscall.EPOLLRDHUP) != 0 {
				f.read(c, buf)
			}
		}
		now := time.Now()
		for len(f.due) > 0 && !f.due[0].due.After(now) {
			tm := heap.Pop(&f.due).(timer)
			if c := f.conns[tm.fd]; c != nil && c.gen == tm.gen {
				f.next(c, now)
			}
		}
	}
}

func (f *epollFake) accept() {
	for {
		fd, _, err := syscall.Accept4(f.ln, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if err := syscall.EpollCtl(f.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(fd)}); err != nil {
			syscall.Close(fd)
			continue
		}
		f.conns[fd] = &fakeConn{fd: fd, step: -1}
	}
}

func (f *epollFake) drop(c *fakeConn) {
	delete(f.conns, c.fd)
	syscall.Close(c.fd)
}

// read takes what the connection sent; a whole request starts its stream.
func (f *epollFake) read(c *fakeConn, buf []byte) {
	n, err := syscall.Read(c.fd, buf)
	if n <= 0 {
		if !errors.Is(err, syscall.EAGAIN) {
			f.drop(c) // the peer left
		}
		return
	}
	c.in = append(c.in, buf[:n]...)
	if c.step >= 0 {
		return // a pipelined request waits for the stream in progress
	}
	f.start(c, time.Now())
}

// start begins the stream of a complete request at the head of c.in.
func (f *epollFake) start(c *fakeConn, now time.Time) {
	head, rest, ok := bytes.Cut(c.in, []byte("\r\n\r\n"))
	if !ok {
		return
	}
	length := 0
	for _, line := range bytes.Split(head, []byte("\r\n"))[1:] {
		name, v, _ := bytes.Cut(line, []byte(":"))
		if strings.EqualFold(string(name), "content-length") {
			length, _ = strconv.Atoi(strings.TrimSpace(string(v)))
		}
	}
	if len(rest) < length {
		return
	}
	body := rest[:length]
	c.usage = bytes.Contains(body, []byte(`"include_usage":true`))
	c.in = append(c.in[:0], rest[length:]...)
	c.step = 0
	c.gen++
	if f.send(c, f.script.open) {
		heap.Push(&f.due, timer{due: now.Add(f.ttft), fd: c.fd, gen: c.gen})
	}
}

// next sends the next token, and with the last one the closing events.
func (f *epollFake) next(c *fakeConn, now time.Time) {
	c.step++
	if c.step < len(f.script.tokens) {
		if f.send(c, f.script.tokens[c.step-1]) {
			heap.Push(&f.due, timer{due: now.Add(f.tpot), fd: c.fd, gen: c.gen})
		}
		return
	}
	last := append([]byte(nil), f.script.tokens[c.step-1]...)
	if c.usage {
		last = append(last, f.script.closeWithUsage...)
	} else {
		last = append(last, f.script.closeWithoutUsage...)
	}
	if !f.send(c, last) {
		return
	}
	c.step = -1
	c.gen++
	if len(c.in) > 0 {
		f.start(c, now)
	}
}

// send writes p, keeping what the socket does not take for EPOLLOUT; false if c is gone.
func (f *epollFake) send(c *fakeConn, p []byte) bool {
	if len(c.out) > 0 {
		c.out = append(c.out, p...)
		return true
	}
	n, err := syscall.Write(c.fd, p)
	if err != nil && !errors.Is(err, syscall.EAGAIN) {
		f.drop(c)
		return false
	}
	if n < len(p) {
		c.out = append(c.out, p[max(n, 0):]...)
		_ = syscall.EpollCtl(f.ep, syscall.EPOLL_CTL_MOD, c.fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLOUT, Fd: int32(c.fd)})
	}
	return true
}

// flush sends what was left unsent; false if c is gone.
func (f *epollFake) flush(c *fakeConn) bool {
	n, err := syscall.Write(c.fd, c.out)
	if err != nil && !errors.Is(err, syscall.EAGAIN) {
		f.drop(c)
		return false
	}
	c.out = c.out[:copy(c.out, c.out[max(n, 0):])]
	if len(c.out) == 0 {
		_ = syscall.EpollCtl(f.ep, syscall.EPOLL_CTL_MOD, c.fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(c.fd)})
	}
	return true
}

// lgTarget is one of the two paths: its request bytes, idle connections and results.
type lgTarget struct {
	sa       syscall.SockaddrInet4
	request  []byte
	idle     []*lgConn
	results  []timing
	failures int
}

// lgConn is one client connection and the response it is reading.
type lgConn struct {
	fd     int
	t      *lgTarget
	busy   bool
	start  time.Time
	in     []byte
	head   bool // the response head is read
	left   int  // bytes of the current chunk still to come; -1 between chunks
	m      meter.Meter
	errMsg string
}

// epollClient starts streaming requests on both targets at a fixed rate and times each as a
// client sees it: TTFT and total from the metered SSE, against the instant it was sent.
type epollClient struct {
	ep      int
	targets []*lgTarget
	conns   map[int]*lgConn
	errs    []string
}

func newEpollClient(t testing.TB, addrs []string, body string) *epollClient {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	c := &epollClient{ep: ep, conns: map[int]*lgConn{}}
	for _, a := range addrs {
		host, port, _ := strings.Cut(a, ":")
		p, _ := strconv.Atoi(port)
		if host != "127.0.0.1" {
			t.Fatalf("the load generator speaks to 127.0.0.1 only, not %s", a)
		}
		c.targets = append(c.targets, &lgTarget{
			sa:      syscall.SockaddrInet4{Port: p, Addr: [4]byte{127, 0, 0, 1}},
			request: fmt.Appendf(nil, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", a, len(body), body),
		})
	}
	t.Cleanup(func() {
		for fd := range c.conns {
			syscall.Close(fd)
		}
		syscall.Close(c.ep)
	})
	return c
}

// dial opens a connection to t, blocking: done while warming up, or when the pool is empty.
func (c *epollClient) dial(t *lgTarget) (*lgConn, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &t.sa); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	if err := syscall.EpollCtl(c.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(fd)}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	lc := &lgConn{fd: fd, t: t}
	c.conns[fd] = lc
	return lc, nil
}

// warm opens n connections to each target and runs one request on each.
func (c *epollClient) warm(n int) error {
	for _, t := range c.targets {
		for range n {
			lc, err := c.dial(t)
			if err != nil {
				return err
			}
			t.idle = append(t.idle, lc)
		}
	}
	for range n {
		for _, t := range c.targets {
			c.send(t, time.Now())
		}
	}
	c.drain(time.Minute)
	for _, t := range c.targets {
		if t.failures > 0 {
			return fmt.Errorf("warm-up: %d requests failed: %s", t.failures, strings.Join(c.errs, "; "))
		}
		t.results = t.results[:0]
	}
	return nil
}

// send starts one request on t at now.
func (c *epollClient) send(t *lgTarget, now time.Time) {
	var lc *lgConn
	if k := len(t.idle); k > 0 {
		lc, t.idle = t.idle[k-1], t.idle[:k-1]
	} else {
		var err error
		if lc, err = c.dial(t); err != nil {
			c.fail(nil, t, err.Error())
			return
		}
	}
	lc.busy, lc.start, lc.head, lc.left, lc.in = true, now, false, -1, lc.in[:0]
	lc.m.Reset(meter.OpenAIChat, true, now)
	if n, err := syscall.Write(lc.fd, t.request); err != nil || n != len(t.request) {
		c.fail(lc, t, fmt.Sprintf("write: %d of %d bytes, %v", n, len(t.request), err))
	}
}

func (c *epollClient) fail(lc *lgConn, t *lgTarget, msg string) {
	t.failures++
	if len(c.errs) < 5 {
		c.errs = append(c.errs, msg)
	}
	if lc != nil {
		delete(c.conns, lc.fd)
		syscall.Close(lc.fd)
	}
}

// busy counts the requests in flight.
func (c *epollClient) busy() int {
	n := 0
	for _, lc := range c.conns {
		if lc.busy {
			n++
		}
	}
	return n
}

// run sends one request to each target every interval, count times, then waits for the
// last responses. It returns how long sending took.
func (c *epollClient) run(count int, every time.Duration) time.Duration {
	start := time.Now()
	for i := range count {
		due := start.Add(time.Duration(i) * every)
		for time.Now().Before(due) {
			c.poll(time.Until(due))
		}
		now := time.Now()
		for _, t := range c.targets {
			c.send(t, now)
		}
	}
	sent := time.Since(start)
	c.drain(time.Minute)
	return sent
}

// drain polls until no request is in flight, or for at most limit.
func (c *epollClient) drain(limit time.Duration) {
	end := time.Now().Add(limit)
	for c.busy() > 0 && time.Now().Before(end) {
		c.poll(50 * time.Millisecond)
	}
}

var lgBuf = make([]byte, 64<<10)

// poll handles what is ready within wait.
func (c *epollClient) poll(wait time.Duration) {
	var evs [128]syscall.EpollEvent
	n, err := epollWait(c.ep, evs[:], wait)
	if err != nil {
		return
	}
	for _, ev := range evs[:n] {
		lc := c.conns[int(ev.Fd)]
		if lc == nil {
			continue
		}
		rn, err := syscall.Read(lc.fd, lgBuf)
		now := time.Now()
		if rn <= 0 {
			if errors.Is(err, syscall.EAGAIN) {
				continue
			}
			if lc.busy {
				c.fail(lc, lc.t, fmt.Sprintf("read: connection closed mid-response (%v)", err))
			} else {
				delete(c.conns, lc.fd) // an idle connection the server closed
				syscall.Close(lc.fd)
				for i, x := range lc.t.idle {
					if x == lc {
						lc.t.idle = append(lc.t.idle[:i], lc.t.idle[i+1:]...)
						break
					}
				}
			}
			continue
		}
		if !lc.busy {
			c.fail(lc, lc.t, "bytes on an idle connection")
			continue
		}
		c.consume(lc, lgBuf[:rn], now)
	}
}

// consume reads response bytes: the head, then chunks, whose data goes to the meter.
func (c *epollClient) consume(lc *lgConn, p []byte, now time.Time) {
	if !lc.head {
		lc.in = append(lc.in, p...)
		head, rest, ok := bytes.Cut(lc.in, []byte("\r\n\r\n"))
		if !ok {
			return
		}
		if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) || !bytes.Contains(bytes.ToLower(head), []byte("transfer-encoding: chunked")) {
			c.fail(lc, lc.t, "unexpected response head: "+string(head))
			return
		}
		lc.head = true
		p = append([]byte(nil), rest...)
		lc.in = lc.in[:0]
	}
	for len(p) > 0 {
		if lc.left > 0 {
			k := min(lc.left, len(p))
			lc.m.Feed(p[:k], now, nil)
			lc.left -= k
			p = p[k:]
			if lc.left == 0 {
				lc.left = -2 // the CRLF after the data
			}
			continue
		}
		// Between chunks: the CRLF ending the last one, then a size line; after the last
		// chunk (size 0), the CRLF that ends the response.
		lc.in = append(lc.in, p...)
		p = nil
		if lc.left == -3 {
			if len(lc.in) >= 2 {
				c.finish(lc, now)
			}
			return
		}
		if lc.left == -2 {
			if len(lc.in) < 2 {
				return
			}
			lc.in = lc.in[2:]
			lc.left = -1
		}
		line, rest, ok := bytes.Cut(lc.in, []byte("\r\n"))
		if !ok {
			return
		}
		size, err := strconv.ParseUint(string(line), 16, 32)
		if err != nil {
			c.fail(lc, lc.t, "bad chunk size "+strconv.Quote(string(line)))
			return
		}
		if size == 0 {
			lc.left, lc.in = -3, append(lc.in[:0], rest...)
			if len(lc.in) >= 2 {
				c.finish(lc, now)
			}
			return
		}
		lc.left = int(size)
		p = append([]byte(nil), rest...)
		lc.in = lc.in[:0]
	}
}

func (c *epollClient) finish(lc *lgConn, now time.Time) {
	r := lc.m.Result(now)
	if st, code := r.Status(true); st != events.StatusOK {
		c.fail(lc, lc.t, fmt.Sprintf("status %s %s", st, code))
		return
	}
	lc.t.results = append(lc.t.results, timing{r.TTFT, r.Total})
	lc.busy = false
	lc.t.idle = append(lc.t.idle, lc)
}

const haveEpollHarness = true

// epollAddedLatency is addedLatency with the epoll load generator: one request to each path
// every interval, b.N times.
func epollAddedLatency(b *testing.B, base, direct string, pid int, every time.Duration) {
	body := `{"model":"gpt-4o","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"measure the proxy"}]}`
	c := newEpollClient(b, []string{strings.TrimPrefix(base, "http://"), strings.TrimPrefix(direct, "http://")}, body)
	if err := c.warm(100); err != nil {
		b.Fatal(err)
	}
	var cpu0 time.Duration
	var mem0 map[string]float64
	if pid != 0 {
		cpu0 = cpuTime(b, pid)
		if !benchFloor {
			mem0 = childMemory(b, base, pid)
		}
	}
	self0 := cpuTime(b, os.Getpid())
	b.ReportAllocs()
	b.ResetTimer()
	sent := c.run(b.N, every)
	b.StopTimer()
	self := cpuTime(b, os.Getpid()) - self0
	via, dir := c.targets[0], c.targets[1]
	if via.failures+dir.failures > 0 || len(via.results) == 0 {
		b.Fatalf("%d requests through the proxy and %d direct failed: %s", via.failures, dir.failures, strings.Join(c.errs, "; "))
	}
	if len(via.results) != b.N || len(dir.results) != b.N {
		b.Fatalf("%d and %d of %d requests finished", len(via.results), len(dir.results), b.N)
	}
	reportAdded(b, via.results, dir.results, sent, self, base, pid, cpu0, mem0)
}
