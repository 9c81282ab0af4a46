//go:build linux

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
)

// serveRelayFloor is the floor under the proxy's added latency (BENCH_PROXY=floor): a relay of
// bytes between each client connection and one upstream connection, on one epoll loop, that
// parses nothing, measures nothing and publishes nothing. Any HTTP proxy does at least this
// much for each piece of a stream: a wake-up, a read and a write. Run through the same load
// generator, it shows what one more hop costs on this machine.
func serveRelayFloor() error {
	return relayFloor(func(client, up int) floorPair { return &bytePair{} })
}

// floorPair is what a relay floor does with the bytes of one client and its upstream
// connection: false drops both.
type floorPair interface {
	fromClient(client, up int, p []byte) bool
	fromUpstream(client, up int, p []byte) bool
}

// bytePair relays the bytes as they come.
type bytePair struct{}

func (bytePair) fromClient(_, up int, p []byte) bool       { return writeAll(up, p) }
func (bytePair) fromUpstream(client, _ int, p []byte) bool { return writeAll(client, p) }

// writeAll writes p at once: pieces are small, and a peer that does not take one whole is
// dropped, which the load generator reports as a failure.
func writeAll(fd int, p []byte) bool {
	n, err := syscall.Write(fd, p)
	return err == nil && n == len(p)
}

// relayFloor serves HTTP_ADDR on one epoll loop on one thread, each client connection paired
// with a connection to EMITTER_UPSTREAM_URL (opened blocking as the client's is accepted: the
// load generator opens its connections while warming up), their bytes handed to a floorPair.
func relayFloor(newPair func(client, up int) floorPair) error {
	upstream := os.Getenv("EMITTER_UPSTREAM_URL")
	ua, err := net.ResolveTCPAddr("tcp4", trimScheme(upstream))
	if err != nil {
		return fmt.Errorf("EMITTER_UPSTREAM_URL=%q: %w", upstream, err)
	}
	la, err := net.ResolveTCPAddr("tcp4", os.Getenv("HTTP_ADDR"))
	if err != nil {
		return fmt.Errorf("HTTP_ADDR=%q: %w", os.Getenv("HTTP_ADDR"), err)
	}
	runtime.LockOSThread()
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
	type side struct {
		client, up int
		pair       floorPair
	}
	sides := map[int]*side{} // both descriptors of a pair
	drop := func(s *side) {
		delete(sides, s.client)
		delete(sides, s.up)
		syscall.Close(s.client)
		syscall.Close(s.up)
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
					s := &side{client: c, up: u, pair: newPair(c, u)}
					sides[c], sides[u] = s, s
				}
				continue
			}
			s := sides[fd]
			if s == nil {
				continue
			}
			rn, err := syscall.Read(fd, buf)
			if rn <= 0 {
				if !errors.Is(err, syscall.EAGAIN) {
					drop(s)
				}
				continue
			}
			ok := false
			if fd == s.client {
				ok = s.pair.fromClient(s.client, s.up, buf[:rn])
			} else {
				ok = s.pair.fromUpstream(s.client, s.up, buf[:rn])
			}
			if !ok {
				drop(s)
			}
		}
	}
}

func trimScheme(u string) string {
	for _, p := range []string{"http://", "https://"} {
		if len(u) > len(p) && u[:len(p)] == p {
			return u[len(p):]
		}
	}
	return u
}
