//go:build !linux

package proxy

import (
	"errors"
	"syscall"
)

// watcher needs epoll: elsewhere the proxy leaves every stream to net/http.
type watcher struct{}

const (
	hangUp       = 0
	readOrHangUp = 0
)

var errNoWatcher = errors.New("watching connections needs Linux")

func newWatcher() (*watcher, error) { return nil, errNoWatcher }

func (*watcher) add(syscall.Conn, uint32, func(uint64)) (uint64, error) { return 0, errNoWatcher }

func (*watcher) rearm(uint64, uint32, func(uint64)) (uint64, bool) { return 0, false }

func (*watcher) remove(uint64) bool { return false }

func (*watcher) Close() error { return nil }
