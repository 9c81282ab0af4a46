//go:build unix && !aix

package proxy

import (
	"net"
	"syscall"
)

// peek reports, without waiting, whether nc has bytes to read (ready), nothing yet (idle), or
// is closed or broken (gone).
func peek(nc net.Conn) peekState {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return unknown
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return gone
	}
	state := gone
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			state = idle
		case err == nil && n > 0:
			state = ready
		}
		return true
	})
	if err != nil {
		return gone
	}
	return state
}
