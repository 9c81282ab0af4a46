package checkpoint

import (
	"context"
	"errors"
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
	if got, err := cp.Load(ctx); err != nil || !got.IsZero() {
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
	if got, err := again.Load(ctx); err != nil || !got.Equal(w) {
		t.Fatalf("loaded %s, %v; want %s", got, err, w)
	}
	other, _ := Open(ctx, js, "alerter-2", 1)
	if got, err := other.Load(ctx); err != nil || !got.IsZero() {
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
	if _, err := cp.Load(ctx); !errors.Is(err, ErrInvalid) {
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
	if got, err := again.Load(ctx); err != nil || !got.Equal(w) {
		t.Fatalf("loaded %s, %v; want %s", got, err, w)
	}
}
