package proxy

import (
	"context"
	"errors"
	"os"
	"syscall"
	"time"
)

// A stream whose upstream stays silent for parkAfter parks (detached first if it was not): its
// goroutine ends, and the watcher waits for the upstream instead (its next bytes, or its end)
// along with the end of the upstream request's context (client gone, idle timeout, shutdown);
// either starts a new goroutine that picks the relay up where it stopped. A stream that waits minutes for its next
// token then costs neither a goroutine nor a stack; one whose tokens keep coming never parks,
// and pays nothing for it but a look at the clock by its watchdog's timer now and then.
//
// The goroutine waits in waitReadable, which only a read deadline can interrupt: the watchdog
// sets one in the past, under pk, only while the goroutine waits there, and the goroutine
// clears it under pk once it is back, so no read of the body ever sees it. (Ending the
// context closes the connection instead; see h1.exchange.)
const parkAfter = 500 * time.Millisecond // Proxy.parkAfter; tests shorten it

// parking is a flight's parking state, guarded by pk.
type parking struct {
	waiting bool   // the relay's goroutine waits for the upstream, no read under way
	asked   bool   // the watchdog interrupted that wait to park
	parked  bool   // no goroutine: the watcher and the context wait
	id      uint64 // the watcher's id for the upstream connection
	unhook  func() bool
	wake    func(uint64)
	up      *h1Body // the body whose connection the watcher can take; nil: the stream never parks
	// Set until the stream's way is known (the loop, parking or neither): the watchdog may
	// fire before the handler gets there, and must then ask again.
	undecided bool
}

// mayPark lets a stream that may be detached park, when its body is read by the proxy's own
// client from a connection the watcher can take.
func (c *flight) mayPark() {
	b, ok := c.body.(*h1Body)
	if !ok {
		return
	}
	if _, ok := b.conn.nc.(syscall.Conn); !ok {
		return
	}
	c.pk.Lock()
	c.park.up = b
	c.pk.Unlock()
}

// decided records that the stream's way is known: from now on askPark's answer stands.
func (c *flight) decided() {
	c.pk.Lock()
	c.park.undecided = false
	c.pk.Unlock()
}

// askPark is the watchdog's: it interrupts the goroutine's wait for the upstream. It reports
// false when the goroutine was not waiting (it was busy, or detaching): ask again later.
func (c *flight) askPark() (done bool) {
	c.pk.Lock()
	defer c.pk.Unlock()
	if c.askLoopDetach() {
		return true
	}
	switch {
	case c.park.undecided:
		return false
	case c.park.up == nil || c.park.parked || c.park.asked:
		return true
	case !c.park.waiting:
		return false
	}
	c.park.asked = true
	_ = c.park.up.conn.nc.SetReadDeadline(time.Unix(1, 0))
	return true
}

// waitOrLeave is where a stream that may be detached leaves its goroutine, between two
// reads: it detaches once the stream has been open for detachAfter, and parks it once its
// upstream has been silent for parkAfter; otherwise it waits for the upstream when w is not
// nil. It reports whether the stream was handed off: the goroutine must then return without
// touching the flight.
func (c *flight) waitOrLeave(w waiter) (handedOff bool) {
	if c.w != nil && time.Since(c.start) >= c.p.detachAfter && c.detach() {
		go c.resume()
		return true
	}
	if w == nil {
		return false
	}
	c.pk.Lock()
	b := c.park.up
	c.park.waiting = b != nil
	c.pk.Unlock()
	if b == nil {
		_ = w.wait() // an error shows in the Read that follows
		return false
	}
	err := b.wait()
	c.pk.Lock()
	c.park.waiting = false
	asked := c.park.asked
	if asked {
		c.park.asked = false
		_ = b.conn.nc.SetReadDeadline(time.Time{})
	}
	c.pk.Unlock()
	if !asked {
		return false
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		c.dog.soon() // bytes came with the request to park: read them, and ask again later
		return false
	}
	if c.w != nil && !c.detach() {
		return false
	}
	if !c.parkOn(b) {
		c.dog.soon()
		return false
	}
	return true
}

// detach takes the stream off net/http (detach.go); the relay goes on writing to the
// connection. False: it stays with net/http for good.
func (c *flight) detach() bool {
	w := c.w
	c.w = nil
	d := c.p.detach(w, c.keep, c.cancel)
	if d == nil {
		c.pk.Lock()
		c.park.up = nil
		c.pk.Unlock()
		return false
	}
	// The handler returns, and net/http ends the request's context: that no longer means
	// the client left (the watcher tells that).
	c.unhook()
	c.d, c.rl.out = d, d
	return true
}

// parkOn parks the stream: the watcher waits for b's connection, and the context's end too.
func (c *flight) parkOn(b *h1Body) bool {
	c.pk.Lock()
	defer c.pk.Unlock()
	if c.park.wake == nil {
		c.park.wake = c.woken
	}
	id, err := c.p.watch.add(b.conn.nc.(syscall.Conn), readOrHangUp, c.park.wake)
	if err != nil {
		return false // the goroutine waits on
	}
	c.park.id, c.park.parked = id, true
	c.park.unhook = context.AfterFunc(c.ctx, func() { c.woken(0) })
	c.p.m.parked.Inc()
	return true
}

// woken picks a parked stream up, once, when the upstream sent something or the context ended.
func (c *flight) woken(uint64) {
	c.pk.Lock()
	if !c.park.parked {
		c.pk.Unlock()
		return
	}
	c.park.parked = false
	id, unhook := c.park.id, c.park.unhook
	c.park.unhook = nil
	c.pk.Unlock()
	c.p.m.parked.Dec()
	c.p.watch.remove(id)
	unhook()
	c.dog.soon()
	go c.resume()
}
