package bus_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// lockedBuffer is a log's destination written by nats.go's callback goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestConnectionLogs: a connection lost is a warning, one the service closes is not (every
// service closes its connection at a clean stop).
func TestConnectionLogs(t *testing.T) {
	srv := testbed.NATS(t)
	cfg, err := parse(t, map[string]string{"NATS_URL": srv.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	nc, err := bus.Connect(cfg, "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(_ *nats.Conn) { close(closed) })
	nc.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not close")
	}
	time.Sleep(100 * time.Millisecond) // the callbacks run in order on one goroutine
	if strings.Contains(logs.String(), "disconnected") {
		t.Fatalf("a connection closed by its service is logged as lost:\n%s", logs.String())
	}

	nc, err = bus.Connect(cfg, "test", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	srv.Shutdown()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "disconnected from NATS") {
		if time.Now().After(deadline) {
			t.Fatalf("a lost connection is not logged:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
