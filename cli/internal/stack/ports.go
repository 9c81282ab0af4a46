package stack

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Addr picks a listen address: preferred when it is free, otherwise (or always, with
// anyPort) a free port on the same host. moved says the preferred one was busy.
func Addr(preferred string, anyPort bool) (addr string, moved bool, err error) {
	host, _, err := net.SplitHostPort(preferred)
	if err != nil {
		return "", false, fmt.Errorf("cannot read address %q: %w", preferred, err)
	}
	if !anyPort {
		l, err := net.Listen("tcp", preferred)
		if err == nil {
			l.Close()
			return preferred, false, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return "", false, fmt.Errorf("cannot listen on %s: %w", preferred, err)
		}
		moved = true
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", false, fmt.Errorf("cannot find a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().String(), moved, nil
}
