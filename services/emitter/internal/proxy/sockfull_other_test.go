//go:build !linux

package proxy

import (
	"net"
	"testing"
)

// sendBufferFull cannot look at the socket on this platform: it takes the buffer for full.
func sendBufferFull(t testing.TB, c *net.TCPConn) bool { return true }

// bytesAcked cannot look at the socket on this platform: it reports no byte taken.
func bytesAcked(t testing.TB, c *net.TCPConn) uint64 { return 0 }
