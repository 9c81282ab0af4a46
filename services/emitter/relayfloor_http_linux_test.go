//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// serveRelayFloorHTTP is the relay floor (BENCH_PROXY=floor-http) doing, on its one loop, the
// least a measuring proxy must do per request beyond the bytes: parse the request's head and
// its JSON body, parse the answer's head, decode the chunks into the meter, and publish the
// event to NATS, as the emitter does. No goroutine per request, no net/http server: what a
// proxy built like nginx, all on one event loop, could reach on this machine.
func serveRelayFloorHTTP() error {
	environ := env.ToMap(os.Environ())
	emitter, stop, err := publishing(context.Background(), environ, true, os.Stderr)
	if err != nil {
		return err
	}
	defer stop()
	upstream := os.Getenv("EMITTER_UPSTREAM_URL")
	ua, err := net.ResolveTCPAddr("tcp4", trimScheme(upstream))
	if err != nil {
		return fmt.Errorf("EMITTER_UPSTREAM_URL=%q: %w", upstream, err)
	}
	la, err := net.ResolveTCPAddr("tcp4", os.Getenv("HTTP_ADDR"))
	if err != nil {
		return fmt.Errorf("HTTP_ADDR=%q: %w", os.Getenv("HTTP_ADDR"), err)
	}
	ln, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = syscall.SetsockoptInt(ln, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(ln, &syscall.SockaddrInet4{Port: la.Port, Addr: [4]byte(la.IP.To4())}); err != nil {
		return err
	}
	if err := syscall.Listen(ln, 4096); err != nil {
		return err
	}
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	add := func(fd int) error {
		return syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(fd)})
	}
	if err := add(ln); err != nil {
		return err
	}
	type pair struct {
		client, up int
		in, out    []byte // a request, an answer's head, not yet whole
		head       bool   // the answer's head is parsed
		chunks     chunkDecoder
		m          meter.Meter
		ev         events.RequestEvent
	}
	pairs := map[int]*pair{}
	failed := false
	drop := func(p *pair) {
		delete(pairs, p.client)
		delete(pairs, p.up)
		syscall.Close(p.client)
		syscall.Close(p.up)
	}
	evs := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	for {
		n, err := syscall.EpollWait(ep, evs, -1)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return err
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == ln {
				for {
					c, _, err := syscall.Accept4(ln, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					u, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
					if err == nil {
						err = syscall.Connect(u, &syscall.SockaddrInet4{Port: ua.Port, Addr: [4]byte(ua.IP.To4())})
					}
					if err == nil {
						err = syscall.SetNonblock(u, true)
					}
					if err != nil {
						syscall.Close(c)
						if u > 0 {
							syscall.Close(u)
						}
						continue
					}
					for _, x := range []int{c, u} {
						_ = syscall.SetsockoptInt(x, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
						_ = add(x)
					}
					p := &pair{client: c, up: u}
					pairs[c], pairs[u] = p, p
				}
				continue
			}
			p := pairs[fd]
			if p == nil {
				continue
			}
			rn, err := syscall.Read(fd, buf)
			if rn <= 0 {
				if !errors.Is(err, syscall.EAGAIN) {
					drop(p)
				}
				continue
			}
			now := time.Now()
			data := buf[:rn]
			if fd == p.client {
				// A request goes upstream whole, once its head and body are in and parsed.
				p.in = append(p.in, data...)
				end := bytes.Index(p.in, []byte("\r\n\r\n"))
				if end < 0 {
					continue
				}
				req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(p.in[:end+4])))
				if err != nil || int64(len(p.in)-end-4) < req.ContentLength {
					continue
				}
				var info struct {
					Model  string `json:"model"`
					Stream bool   `json:"stream"`
				}
				_ = json.Unmarshal(p.in[end+4:], &info)
				p.m.Reset(meter.OpenAIChat, info.Stream, now)
				p.ev = events.RequestEvent{V: events.Version, EventID: events.NewEventID(), TS: now.UTC(), Model: info.Model,
					Provider: "openai", Instance: ua.String(), Stream: info.Stream, Scene: "default", Env: "dev"}
				if wn, err := syscall.Write(p.up, p.in); err != nil || wn != len(p.in) {
					drop(p)
					continue
				}
				p.in, p.head = p.in[:0], false
				continue
			}
			if wn, err := syscall.Write(p.client, data); err != nil || wn != rn {
				drop(p)
				continue
			}
			if !p.head {
				p.out = append(p.out, data...)
				end := bytes.Index(p.out, []byte("\r\n\r\n"))
				if end < 0 {
					continue
				}
				resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(p.out[:end+4])), nil)
				if err != nil {
					drop(p)
					continue
				}
				p.ev.HTTPStatus, p.head, p.chunks = resp.StatusCode, true, chunkDecoder{}
				data = append([]byte(nil), p.out[end+4:]...)
				p.out = p.out[:0]
			}
			if p.chunks.feed(data, func(b []byte) { p.m.Feed(b, now, nil) }) {
				res := p.m.Result(now)
				res.Fill(&p.ev)
				p.ev.Status, p.ev.ErrorCode = res.Status(p.ev.Stream)
				if err := emitter.Emit(&p.ev, now); err != nil && !failed {
					failed = true // said once: the floor would cost less than it should
					fmt.Fprintln(os.Stderr, "floor-http: event not published:", err)
				}
			}
		}
	}
}

// chunkDecoder takes the chunked coding off a body, piece by piece.
type chunkDecoder struct {
	line []byte
	left int  // data bytes left in the chunk; -1 while a size line is read, -2 at the CRLF after data
	last bool // the size line said 0
}

// feed gives the data in p to data; it reports the body's end.
func (d *chunkDecoder) feed(p []byte, data func([]byte)) bool {
	if d.left == 0 && d.line == nil && !d.last {
		d.left = -1
	}
	for len(p) > 0 {
		switch {
		case d.left > 0:
			k := min(d.left, len(p))
			data(p[:k])
			d.left -= k
			p = p[k:]
			if d.left == 0 {
				d.left = -2
			}
		case d.left == -2:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				return false
			}
			p, d.left = p[i+1:], -1
		default:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				d.line = append(d.line, p...)
				return false
			}
			d.line = append(d.line, p[:i]...)
			p = p[i+1:]
			if d.last {
				return true // the empty line after the last chunk
			}
			size, _ := strconv.ParseUint(string(bytes.TrimSpace(d.line)), 16, 32)
			d.line = d.line[:0]
			if size == 0 {
				d.last = true
				continue
			}
			d.left = int(size)
		}
	}
	return false
}
