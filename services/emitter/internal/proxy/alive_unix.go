//go:build unix

package proxy

import (
	"net"
	"syscall"
)

// alive reports whether an idle connection is still open: the upstream may have closed it
// since (uvicorn, which vLLM runs on, closes idle ones after 5 s). It peeks without waiting.
func alive(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := true
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing to read is the one good answer: an end of stream, an error, or bytes
		// nobody asked for all make the connection useless.
		open = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && open
}
