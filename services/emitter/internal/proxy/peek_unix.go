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
		n, err := recvPeek(fd, b[:])
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

// waitReadable waits, without a buffer, until nc has bytes to read, its end or an error to
// report (its next Read then returns at once), or its deadline passes.
func waitReadable(nc net.Conn) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil // the Read that follows waits
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	var b [1]byte
	woken := false
	return rc.Read(func(fd uintptr) bool {
		// Woken by the poller, the descriptor is readable: looking again would cost a system
		// call per event (if the wake-up was spurious, the Read that follows waits in turn).
		if woken {
			return true
		}
		woken = true
		// Bytes may have come before the poller was asked: look once. False waits.
		_, err := recvPeek(fd, b[:])
		return err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
	})
}

// recvPeek looks at the socket's next bytes without taking them and without waiting.
func recvPeek(fd uintptr, b []byte) (int, error) {
	for {
		n, _, err := syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err != syscall.EINTR {
			return n, err
		}
	}
}
