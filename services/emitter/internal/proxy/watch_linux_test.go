//go:build linux

package proxy

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (ours, theirs net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	theirs, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ours, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ours.Close(); theirs.Close() })
	return ours, theirs
}

func TestWatcher(t *testing.T) {
	w, err := newWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	fired := make(chan uint64, 8)
	fire := func(id uint64) { fired <- id }
	expect := func(what string, want uint64) {
		t.Helper()
		select {
		case id := <-fired:
			if want == 0 || id != want {
				t.Fatalf("%s: fired for %d, want %d", what, id, want)
			}
		case <-time.After(2 * time.Second):
			if want != 0 {
				t.Fatalf("%s: did not fire", what)
			}
		}
	}

	t.Run("hang-up, not bytes", func(t *testing.T) {
		ours, theirs := tcpPair(t)
		id, err := w.add(ours.(syscall.Conn), hangUp, fire)
		if err != nil {
			t.Fatal(err)
		}
		theirs.Write([]byte("next request")) // a client may send its next request early
		select {
		case id := <-fired:
			t.Fatalf("fired for %d on bytes", id)
		case <-time.After(100 * time.Millisecond):
		}
		theirs.Close()
		expect("hang-up", id)
		if w.remove(id) {
			t.Fatal("remove after the event reported it pending")
		}
	})
	t.Run("removed, never fires", func(t *testing.T) {
		ours, theirs := tcpPair(t)
		id, _ := w.add(ours.(syscall.Conn), readOrHangUp, fire)
		if !w.remove(id) {
			t.Fatal("remove before the event reported it fired")
		}
		theirs.Close()
		select {
		case id := <-fired:
			t.Fatalf("fired for %d after remove", id)
		case <-time.After(100 * time.Millisecond):
		}
	})
	t.Run("rearmed for bytes, once", func(t *testing.T) {
		ours, theirs := tcpPair(t)
		id, _ := w.add(ours.(syscall.Conn), hangUp, fire)
		id2, ok := w.rearm(id, readOrHangUp, fire)
		if !ok || id2 == id {
			t.Fatalf("rearm: %d %v", id2, ok)
		}
		theirs.Write([]byte("a"))
		expect("bytes", id2)
		theirs.Write([]byte("b"))
		theirs.Close()
		select {
		case id := <-fired:
			t.Fatalf("fired again, for %d", id)
		case <-time.After(100 * time.Millisecond):
		}
		if _, ok := w.rearm(id2, hangUp, fire); ok {
			t.Fatal("rearmed after the event")
		}
	})
	t.Run("closed connection, same descriptor number reused", func(t *testing.T) {
		ours, theirs := tcpPair(t)
		id, _ := w.add(ours.(syscall.Conn), hangUp, fire)
		ours.Close() // the kernel forgets it; the id stays in the map until removed
		if !w.remove(id) {
			t.Fatal("remove of a closed connection")
		}
		theirs.Close()
		ours2, theirs2 := tcpPair(t)
		id2, err := w.add(ours2.(syscall.Conn), hangUp, fire)
		if err != nil {
			t.Fatal(err)
		}
		theirs2.Close()
		expect("the new connection's hang-up", id2)
	})
}
