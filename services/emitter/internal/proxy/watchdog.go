package proxy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// The phases of a watched exchange.
const (
	waitingHeaders int32 = iota
	answered             // the response headers arrived first: the upstream timeout no longer applies
	timedOut             // the upstream timeout fired first: the response, if it comes, is dropped
	finished
)

// watchdog ends an exchange whose upstream is too slow: no response headers within the
// upstream timeout, or a body silent for the idle timeout. Until the answer has begun (a
// stream's first content event, a body's first byte) a silence is allowed up to the upstream
// timeout since the start as well: an upstream may send the head of a stream at once and
// its first token only after a long prefill, a queue, or a model reasoning. Which of "headers arrived" and
// "timeout fired" came first is decided once, by one compare-and-swap, so a response that
// arrives as the timeout fires is either relayed whole or dropped for a 504, never both.
// The body's reads only store a timestamp; the timer checks it when it fires, so no timer
// is reset per chunk.
type watchdog struct {
	phase     atomic.Int32
	last      atomic.Int64 // upstream activity, in ns since start; busy while writing to the client
	start     time.Time
	headers   time.Duration // the upstream timeout
	idle      time.Duration
	begun     atomic.Bool // the answer has begun: the idle timeout alone applies
	cancel    context.CancelCauseFunc
	timer     *time.Timer
	park      func() bool   // asks the stream to park once silent for parkAfter (park.go)
	parkAfter time.Duration // set with park
}

// busy marks the time spent writing to the client: a slow client is not a silent upstream.
const busy = -1

func (d *watchdog) arm(start time.Time, headers, idle time.Duration, cancel context.CancelCauseFunc) {
	d.start, d.headers, d.idle, d.cancel = start, headers, idle, cancel
	d.timer = time.AfterFunc(headers, d.fire)
}

func (d *watchdog) fire() {
	if d.phase.CompareAndSwap(waitingHeaders, timedOut) {
		d.cancel(errUpstreamTimeout)
		return
	}
	if d.phase.Load() != answered {
		return
	}
	last := d.last.Load()
	if last == busy {
		// Writing to the client: not silent. A stream that may park is looked at again soon,
		// not after a whole idle timeout, or one that fell silent right after the write would
		// hold its goroutine (or net/http's state) that long.
		wait := d.idle
		if d.park != nil {
			wait = min(wait, d.parkAfter)
		}
		d.timer.Reset(wait)
		return
	}
	since := time.Since(d.start)
	silent := since - time.Duration(last)
	wait := d.idle - silent
	if !d.begun.Load() {
		wait = max(wait, d.headers-since)
	}
	if wait <= 0 {
		d.cancel(errStreamIdle)
		return
	}
	if d.park != nil {
		if silent >= d.parkAfter {
			if !d.park() {
				wait = min(wait, d.parkAfter)
			}
		} else {
			wait = min(wait, d.parkAfter-silent)
		}
	}
	d.timer.Reset(wait)
}

// soon has the timer look again in parkAfter: a parked stream that woke may park again.
func (d *watchdog) soon() {
	if d.phase.Load() == answered {
		d.timer.Reset(min(d.parkAfter, d.idle))
	}
}

// answer reports whether the response headers beat the upstream timeout; from then on the
// idle timeout watches the body.
func (d *watchdog) answer(now time.Time) bool {
	if !d.phase.CompareAndSwap(waitingHeaders, answered) {
		return false
	}
	d.active(now)
	if d.park != nil {
		d.timer.Reset(min(d.parkAfter, d.idle))
	} else {
		d.timer.Reset(d.idle)
	}
	return true
}

// saw tells the watchdog, after the meter read a piece, whether the answer has begun.
func (d *watchdog) saw(m *meter.Meter) {
	if !d.begun.Load() && m.Begun() {
		d.begun.Store(true)
	}
}

// active records bytes from the upstream at now.
func (d *watchdog) active(now time.Time) { d.last.Store(int64(now.Sub(d.start))) }

// writing stops the idle clock while the client takes the bytes; active restarts it.
func (d *watchdog) writing() { d.last.Store(busy) }

// stop ends the watch; a fire already under way does nothing more.
func (d *watchdog) stop() {
	d.phase.Store(finished)
	d.timer.Stop()
}

// expired settles a request that got no response: it reports whether the upstream timeout
// fired first. Once it returns, the timeout can no longer fire, so an error it did not
// cause stays the upstream's or the client's.
func (d *watchdog) expired() bool {
	return !d.phase.CompareAndSwap(waitingHeaders, finished) && d.phase.Load() == timedOut
}
