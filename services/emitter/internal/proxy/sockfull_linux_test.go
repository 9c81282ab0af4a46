//go:build linux

package proxy

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// sendBufferFull reports whether c's socket takes no more bytes now: a write to it waits until
// the peer reads.
func sendBufferFull(t testing.TB, c *net.TCPConn) bool {
	t.Helper()
	full := false
	control(t, c, func(fd int) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, 0)
		full = err == nil && n == 0
	})
	return full
}

// bytesAcked is how many bytes of c's the peer's kernel has taken so far, read or not.
func bytesAcked(t testing.TB, c *net.TCPConn) uint64 {
	t.Helper()
	var acked uint64
	control(t, c, func(fd int) {
		info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			t.Fatalf("TCP_INFO: %v", err)
		}
		acked = info.Bytes_acked
	})
	return acked
}

func control(t testing.TB, c *net.TCPConn, f func(fd int)) {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Control(func(fd uintptr) { f(int(fd)) }); err != nil {
		t.Fatal(err)
	}
}
