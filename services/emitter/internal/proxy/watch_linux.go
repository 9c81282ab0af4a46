//go:build linux

package proxy

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// watcher tells when connections it watches become readable or are hung up on, for any
// number of connections, with one goroutine and no buffer: its own epoll instance, which
// itself waits in the runtime's poller. A client's connection is watched while the proxy
// relays a stream on it (a hang-up cancels the upstream request) and while it waits for the
// client's next request (readable: it goes back to the HTTP server). A goroutine blocked in a
// read per connection would cost each one a stack; net/http's own watch costs a goroutine
// and a 4 KB buffer.
//
// Registrations are one-shot and named by an id, never by the descriptor, so an event for a
// connection that is gone can never be taken for its descriptor's next owner.
type watcher struct {
	file *os.File // the epoll instance
	rc   syscall.RawConn

	mu     sync.Mutex
	next   uint64
	on     map[uint64]watch
	closed bool
}

type watch struct {
	conn syscall.RawConn
	fire func(id uint64)
}

// Masks for add.
const (
	hangUp       = syscall.EPOLLRDHUP // EPOLLHUP and EPOLLERR are always reported
	readOrHangUp = syscall.EPOLLIN | syscall.EPOLLRDHUP
)

var errWatcherClosed = errors.New("the connection watcher is closed")

func newWatcher() (*watcher, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("cannot create an epoll instance: %w", err)
	}
	// Non-blocking, the file goes into the runtime's poller: the watcher's goroutine waits
	// there, not in a system call holding a thread.
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, fmt.Errorf("cannot make the epoll instance non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cannot use the epoll instance: %w", err)
	}
	w := &watcher{file: f, rc: rc, on: map[uint64]watch{}}
	go w.run()
	return w, nil
}

// add watches c for the events in mask and calls fire, once, from the watcher's goroutine
// when one happens; fire must not block. remove cancels it.
func (w *watcher) add(c syscall.Conn, mask uint32, fire func(id uint64)) (uint64, error) {
	conn, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, errWatcherClosed
	}
	w.next++
	id := w.next
	// In the map before epoll has it: the event may come at once.
	w.on[id] = watch{conn: conn, fire: fire}
	ev := syscall.EpollEvent{Events: mask | syscall.EPOLLONESHOT, Fd: int32(id), Pad: int32(id >> 32)}
	if err := w.ctl(conn, syscall.EPOLL_CTL_ADD, &ev); err != nil {
		delete(w.on, id)
		return 0, fmt.Errorf("cannot watch a connection: %w", err)
	}
	return id, nil
}

// rearm watches the connection of id for other events, under a new id, in one system call;
// it reports false, and watches nothing, when id's event came first.
func (w *watcher) rearm(id uint64, mask uint32, fire func(id uint64)) (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt, ok := w.on[id]
	if !ok {
		return 0, false
	}
	delete(w.on, id)
	w.next++
	id = w.next
	w.on[id] = watch{conn: wt.conn, fire: fire}
	ev := syscall.EpollEvent{Events: mask | syscall.EPOLLONESHOT, Fd: int32(id), Pad: int32(id >> 32)}
	if err := w.ctl(wt.conn, syscall.EPOLL_CTL_MOD, &ev); err != nil {
		delete(w.on, id)
		w.forget(wt.conn)
		return 0, false
	}
	return id, true
}

// remove stops watching id. It reports false when the event came first: fire has been or
// is being called.
func (w *watcher) remove(id uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	wt, ok := w.on[id]
	if ok {
		delete(w.on, id)
		w.forget(wt.conn)
	}
	return ok
}

// ctl runs epoll_ctl on the connection's descriptor. Through Control, the descriptor cannot
// be closed, and its number given to another connection, meanwhile. w.mu is held, so the
// epoll instance is open.
func (w *watcher) ctl(conn syscall.RawConn, op int, ev *syscall.EpollEvent) error {
	var cerr error
	err := conn.Control(func(fd uintptr) {
		cerr = w.rc.Control(func(epfd uintptr) { cerr = syscall.EpollCtl(int(epfd), op, int(fd), ev) })
	})
	if err != nil {
		return err
	}
	return cerr
}

// forget takes a connection out of the epoll instance. One closed already is out of it.
func (w *watcher) forget(conn syscall.RawConn) {
	_ = w.ctl(conn, syscall.EPOLL_CTL_DEL, &syscall.EpollEvent{})
}

func (w *watcher) run() {
	var evs [128]syscall.EpollEvent
	for {
		var n int
		var werr error
		// Read waits in the runtime's poller until epoll has events, each time the function
		// reports false; epoll_wait itself never blocks.
		err := w.rc.Read(func(epfd uintptr) bool {
			n, werr = syscall.EpollWait(int(epfd), evs[:], 0)
			if werr == syscall.EINTR {
				n, werr = 0, nil
			}
			return n > 0 || werr != nil
		})
		if err != nil || werr != nil {
			return // closed
		}
		for _, ev := range evs[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			w.mu.Lock()
			wt, ok := w.on[id]
			if ok {
				delete(w.on, id)
				w.forget(wt.conn)
			}
			w.mu.Unlock()
			if ok {
				wt.fire(id)
			}
		}
	}
}

// Close stops the watcher; what it still watches is never reported.
func (w *watcher) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	clear(w.on)
	return w.file.Close()
}
