//go:build !unix || aix

package proxy

import "net"

// peek cannot look here: a connection the upstream closed fails on use and is replaced.
func peek(net.Conn) peekState { return unknown }

// waitReadable cannot wait without reading here: the Read that follows waits, with its buffer.
func waitReadable(net.Conn) error { return nil }
