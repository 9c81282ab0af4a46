package checkpoint

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

func TestSaveLoad(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := testbed.JetStream(t)
	cp, err := Open(ctx, js, "alerter", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cp.Load(ctx, time.Now()); err != nil || !got.IsZero() {
		t.Fatalf("fresh checkpoint %s, %v; want zero, nil", got, err)
	}
	w := time.Date(2026, 3, 3, 12, 0, 15, 0, time.FixedZone("CET", 3600))
	if err := cp.Save(ctx, w); err != nil {
		t.Fatal(err)
	}
	// Opening again (a restart) finds it; another consumer's key is separate.
	again, err := Open(ctx, js, "alerter", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Load(ctx, time.Now()); err != nil || !got.Equal(w) {
		t.Fatalf("loaded %s, %v; want %s", got, err, w)
	}
	other, _ := Open(ctx, js, "alerter-2", 1)
	if got, err := other.Load(ctx, time.Now()); err != nil || !got.IsZero() {
		t.Fatalf("another consumer's checkpoint %s, %v", got, err)
	}
	// Garbage in the bucket is reported as invalid, not a crash.
	kv, err := js.KeyValue(ctx, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "alerter", []byte("{not json")); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Load(ctx, time.Now()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("garbage checkpoint: err %v, want ErrInvalid", err)
	}
}

// TestSaveMakesTheBucketAgain: a bucket gone while the alerter runs (deleted, or lost with
// a NATS store) is made again by the next save; before, every save failed, and the window
// held for its checkpoint, and every later one, waited until a restart.
func TestSaveMakesTheBucketAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := testbed.JetStream(t)
	cp, err := Open(ctx, js, "alerter", 1)
	if err != nil {
		t.Fatal(err)
	}
	w := time.Date(2026, 3, 3, 12, 0, 15, 0, time.UTC)
	if err := cp.Save(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, Bucket); err != nil {
		t.Fatal(err)
	}
	w = w.Add(15 * time.Second)
	if err := cp.Save(ctx, w); err != nil {
		t.Fatalf("save to a bucket gone: %v", err)
	}
	again, err := Open(ctx, js, "alerter", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Load(ctx, time.Now()); err != nil || !got.Equal(w) {
		t.Fatalf("loaded %s, %v; want %s", got, err, w)
	}
}

// TestLoadAheadOfTheClock: a checkpoint further ahead of the clock than a window is ever
// taken (stored while the clocks ran a day ahead, since set right) is invalid, and so
// ignored at start. Taken, every window up to it counted as late, none evaluated, until the
// clock caught up.
func TestLoadAheadOfTheClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, js := testbed.JetStream(t)
	cp, err := Open(ctx, js, "alerter", 1)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	if err := cp.Save(ctx, now.Add(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, err := cp.Load(ctx, now); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "ahead") {
		t.Fatalf("a checkpoint a day ahead: %s, %v; want ErrInvalid", got, err)
	}
	near := now.Add(5 * time.Minute) // within the skew a window may have
	if err := cp.Save(ctx, near); err != nil {
		t.Fatal(err)
	}
	if got, err := cp.Load(ctx, now); err != nil || !got.Equal(near) {
		t.Fatalf("a checkpoint 5 minutes ahead: %s, %v; want it", got, err)
	}
}
