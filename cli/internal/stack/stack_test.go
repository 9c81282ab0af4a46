package stack

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAddr(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busy := l.Addr().String()
	got, moved, err := Addr(busy, false)
	if err != nil || !moved || got == busy {
		t.Fatalf("busy %s: got %s moved %v err %v", busy, got, moved, err)
	}
	l.Close()
	if got, moved, err := Addr(busy, false); err != nil || moved || got != busy {
		t.Fatalf("free %s: got %s moved %v err %v", busy, got, moved, err)
	}
	if got, moved, err := Addr(busy, true); err != nil || moved || got == busy {
		t.Fatalf("any port: got %s moved %v err %v", got, moved, err)
	}
	if _, _, err := Addr("no-port", false); err == nil {
		t.Fatal("an address without a port was accepted")
	}
}

func TestProc(t *testing.T) {
	dir := t.TempDir()
	// A child that ignores SIGTERM is killed after the grace period.
	p, err := Start(Cmd{Name: "stubborn", Path: "/bin/sh", Args: []string{"-c", "trap '' TERM; echo started; sleep 30"}, Log: filepath.Join(dir, "a.log")})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := p.Stop(300 * time.Millisecond); err == nil || !strings.Contains(err.Error(), "was killed") {
		t.Fatalf("stop: %v", err)
	}
	if err := p.Stop(time.Second); err == nil {
		t.Fatal("a second Stop forgot the first result")
	}

	// A child that exits at start: WaitReady returns at once with the end of its log.
	p, err = Start(Cmd{Name: "broken", Path: "/bin/sh", Args: []string{"-c", "echo 'cannot listen: address in use'; exit 3"}, Log: filepath.Join(dir, "b.log")})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = p.WaitReady(context.Background(), "http://127.0.0.1:1/readyz", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "cannot listen: address in use") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("WaitReady: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("WaitReady waited for its timeout on a child that had exited")
	}

	if _, err := Start(Cmd{Name: "missing", Path: filepath.Join(dir, "nope"), Log: filepath.Join(dir, "c.log")}); err == nil {
		t.Fatal("a missing binary started")
	}
}

func TestFindRoot(t *testing.T) {
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FindRoot(filepath.Join(root, "cli", "internal")); err != nil {
		t.Fatal(err)
	}
	if _, err := FindRoot(t.TempDir()); err == nil {
		t.Fatal("a folder outside the checkout was taken for it")
	}
}
