package testbed

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/chserver"
)

func TestFreePortBelowClientRange(t *testing.T) {
	low := ephemeralLow()
	if low <= firstPort+1000 {
		t.Skipf("the range for outgoing connections starts at %d; nothing to keep out of", low)
	}
	for i := 0; i < 50; i++ {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < firstPort || port >= low {
			t.Fatalf("port %d is outside [%d, %d)", port, firstPort, low)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("port %d was given as free: %v", port, err)
		}
		l.Close()
	}
}

// ownServer starts a ClickHouse server of the test's own, skipped or failed as ClickHouse
// would be.
func ownServer(t *testing.T) *ClickHouseServer {
	t.Helper()
	s, err := StartClickHouse(filepath.Join(os.TempDir(), "tokenscope-ch-"+randHex(4)))
	if err != nil {
		if errors.Is(err, chserver.ErrNotInstalled) && os.Getenv("CI") != "true" {
			t.Skipf("ClickHouse is not installed (%v); install it with: %s", err, InstallHint)
		}
		t.Fatalf("cannot start ClickHouse: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func answers(t *testing.T, s *ClickHouseServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := chdb.Open(ctx, chdb.Config{Addr: s.Addr, HTTPAddr: s.HTTPAddr, DB: "default", User: "default", DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("the server does not answer: %v", err)
	}
	db.Close()
}

// TestStartMovesOffATakenPort hands the server a port another listener holds, as a test
// binary beside it may between the choice and the bind: the server starts on other ports.
func TestStartMovesOffATakenPort(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldPort := held.Addr().(*net.TCPAddr).Port
	calls := 0
	choosePort = func() (int, error) {
		calls++
		if calls == 1 {
			return heldPort, nil
		}
		return freePort()
	}
	defer func() { choosePort = freePort }()

	s := ownServer(t)
	if calls < 4 {
		t.Fatalf("ports were chosen %d times; the taken port was not given up", calls)
	}
	if s.Addr == held.Addr().String() {
		t.Fatalf("the server reports the taken address %s", s.Addr)
	}
	answers(t, s)
}

// TestRestartWaitsForItsPort halts a server, lets another listener hold its port for a
// while, and restarts it: the restart waits for the port instead of failing.
func TestRestartWaitsForItsPort(t *testing.T) {
	s := ownServer(t)
	if err := s.Halt(); err != nil {
		t.Fatal(err)
	}
	held, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatalf("cannot hold the halted server's port: %v", err)
	}
	release := time.AfterFunc(2*time.Second, func() { held.Close() })
	defer release.Stop()
	if err := s.Restart(); err != nil {
		t.Fatalf("restart while the port was held for 2 s: %v", err)
	}
	answers(t, s)
}
