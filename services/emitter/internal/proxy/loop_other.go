//go:build !linux

package proxy

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
)

// The relay loop is Linux's (loop_linux.go); elsewhere streams are relayed on goroutines.
type evloop struct{}

type loopStream struct{}

func newLoop(*slog.Logger) (*evloop, error) { return nil, errors.New("no relay loop on this platform") }

func (l *evloop) adopt(nc net.Conn) (net.Conn, error) { return nc, nil }

func (l *evloop) close() {}

func (c *flight) onLoop(*http.Request, *response) (onLoop, handedOff bool) { return false, false }

func (c *flight) askLoopDetach() bool { return false }
