//go:build !linux

package main

import (
	"errors"
	"testing"
	"time"
)

// The epoll load generator is Linux's; elsewhere the benchmark uses net/http's client and
// fakellm's server.
const haveEpollHarness = false

func startEpollFake(b testing.TB, _, _ time.Duration, _ int) *struct{ addr string } {
	b.Skip("the epoll load generator needs Linux")
	return nil
}

func epollAddedLatency(b *testing.B, _, _ string, _ int, _ time.Duration) {
	b.Skip("the epoll load generator needs Linux")
}

func serveRelayFloor() error { return errors.New("the relay floor needs Linux") }

func serveRelayFloorHTTP() error { return errors.New("the relay floor needs Linux") }
