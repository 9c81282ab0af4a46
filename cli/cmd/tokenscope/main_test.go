package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/stack"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

func TestMain(m *testing.M) { testbed.Main(m) }

// services builds the four service binaries into a temporary folder, as the demo does
// (the go build cache makes a second build a matter of linking).
func services(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	if err := stack.Build(ctx, rootDir(t), dir, stack.Services); err != nil {
		t.Fatalf("cannot build the services: %v", err)
	}
	return dir
}

// lockedBuffer is an io.Writer safe for a goroutine writing while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// need skips (or under CI fails) without the named programs.
func need(t *testing.T, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required under CI: %v", b, err)
			}
			t.Skipf("%s not found; install it to run this test", b)
		}
	}
}

func rootDir(t *testing.T) string {
	t.Helper()
	root, err := stack.FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	return root
}
