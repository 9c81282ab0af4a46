package proxy

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchdogParksAfterAWrite: a stream whose watchdog looked while it was writing to the
// client, and which then fell silent, is asked to park after parkAfter, not after the idle
// timeout (it once waited the whole idle timeout, holding its state that long).
func TestWatchdogParksAfterAWrite(t *testing.T) {
	var asked atomic.Int64
	var d watchdog
	d.park, d.parkAfter = func() bool { asked.Add(1); return true }, 20*time.Millisecond
	_, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	d.arm(time.Now(), time.Minute, time.Minute, cancel)
	defer d.stop()
	if !d.answer(time.Now()) {
		t.Fatal("the headers did not beat the upstream timeout")
	}
	d.writing()
	time.Sleep(60 * time.Millisecond) // the timer looks while the write goes on
	d.active(time.Now())
	deadline := time.Now().Add(30 * time.Second) // a bound for a loaded machine, half the idle timeout
	for asked.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("not asked to park 30 s after falling silent")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
