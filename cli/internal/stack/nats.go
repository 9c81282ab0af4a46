package stack

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartNATS starts an embedded nats-server with JetStream on addr, storing in dir.
func StartNATS(addr, dir string) (*server.Server, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cannot read NATS address %q: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("cannot read NATS port %q: %w", port, err)
	}
	s, err := server.NewServer(&server.Options{
		ServerName: "tokenscope-demo",
		Host:       host,
		Port:       p,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: 8 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot configure nats-server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats-server did not accept connections on %s within 15s (is the port taken?)", addr)
	}
	return s, nil
}
