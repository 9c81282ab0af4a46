package nvmlsource

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestShutdownMidTickKeepsReads: SIGTERM while a tick waits for its GPUs' reads. The reads
// are under way and end within the tick's wait; had the tick stopped waiting at the
// signal, their samples would be late, and with no later tick to publish them, lost. The
// tick waits for them as it would have (Options.Wait at most) and returns them.
func TestShutdownMidTickKeepsReads(t *testing.T) {
	srv, devs := h200(t, 2)
	for _, d := range devs {
		h := &hang{callTime: 5 * time.Millisecond, recover: make(chan struct{})}
		h.install(d)
		h.on.Store(true)
	}
	src, err := New(srv, Options{Recheck: time.Minute, Wait: 2 * time.Second}, prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel) // a read takes some 50ms: the signal comes in the middle
	got := src.Sample(ctx, t0, nil)
	if len(got) != 2 {
		t.Fatalf("%d samples of a tick cut by shutdown, want 2", len(got))
	}
	for _, s := range got {
		if s.PowerW == nil || s.EnergyJ == nil {
			t.Errorf("GPU %d's sample has no readings: %+v", s.GPUIndex, s)
		}
	}
}
