//go:build unix

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
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	full := false
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		n, err := unix.Poll(fds, 0)
		full = err == nil && n == 0
	})
	if err != nil {
		t.Fatal(err)
	}
	return full
}
