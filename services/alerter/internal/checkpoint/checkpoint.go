package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// Bucket is the key-value bucket the alerter keeps its checkpoints in, one key per durable
// consumer.
const Bucket = "ALERTER"

// ErrInvalid is returned by Load for a stored checkpoint that cannot be read.
var ErrInvalid = errors.New("invalid checkpoint")

// KV is a checkpoint in a JetStream key-value bucket.
type KV struct {
	kv       jetstream.KeyValue
	key      string
	js       jetstream.JetStream
	replicas int
}

type value struct {
	V           int       `json:"v"`
	WindowStart time.Time `json:"window_start"`
}

// Open creates or updates the bucket and returns the checkpoint stored under key (the
// consumer's name: letters, digits, - and _).
func Open(ctx context.Context, js jetstream.JetStream, key string, replicas int) (*KV, error) {
	kv, err := ensure(ctx, js, replicas)
	if err != nil {
		return nil, err
	}
	return &KV{kv: kv, key: key, js: js, replicas: replicas}, nil
}

func ensure(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	return bus.EnsureKeyValue(ctx, js, Bucket, "tokenscope alerter: latest window evaluated and delivered, per consumer", replicas)
}

// maxAhead is how far ahead of the clock a stored window start may be: the intake takes
// windows that start at most this far ahead of it (2 × events.MaxClockSkew).
const maxAhead = 2 * events.MaxClockSkew

// Load returns the stored window start, or the zero time when none is stored. One more than
// maxAhead ahead of now (stored while the clocks ran ahead, since set right) is invalid:
// taken, every window up to it would count as late until the clock caught up.
func (c *KV) Load(ctx context.Context, now time.Time) (time.Time, error) {
	e, err := c.kv.Get(ctx, c.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("cannot read checkpoint %s/%s: %w", Bucket, c.key, err)
	}
	var v value
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.V != 1 {
		return time.Time{}, fmt.Errorf("%w %s/%s: %q", ErrInvalid, Bucket, c.key, truncate(e.Value()))
	}
	if ahead := v.WindowStart.Sub(now); ahead > maxAhead {
		return time.Time{}, fmt.Errorf("%w %s/%s: window_start %s is %s ahead of the clock (at most %s)", ErrInvalid, Bucket, c.key,
			v.WindowStart.UTC().Format(time.RFC3339), ahead.Round(time.Second), maxAhead)
	}
	return v.WindowStart, nil
}

// Save stores windowStart; it returns once JetStream has it.
func (c *KV) Save(ctx context.Context, windowStart time.Time) error {
	data, err := json.Marshal(value{V: 1, WindowStart: windowStart.UTC()})
	if err != nil {
		return fmt.Errorf("cannot encode checkpoint: %w", err)
	}
	_, err = c.kv.Put(ctx, c.key, data)
	if err != nil && c.gone(ctx) {
		// The bucket was deleted, or lost with a NATS store: every save would fail, and the
		// window held for it, and every later one, would wait until a restart.
		kv, kerr := ensure(ctx, c.js, c.replicas)
		if kerr != nil {
			return fmt.Errorf("cannot save checkpoint %s/%s: the bucket is gone: %w", Bucket, c.key, kerr)
		}
		c.kv = kv
		_, err = c.kv.Put(ctx, c.key, data)
	}
	if err != nil {
		return fmt.Errorf("cannot save checkpoint %s/%s: %w", Bucket, c.key, err)
	}
	return nil
}

// gone reports whether the bucket is known to be missing.
func (c *KV) gone(ctx context.Context) bool {
	_, err := c.js.KeyValue(ctx, Bucket)
	return errors.Is(err, jetstream.ErrBucketNotFound)
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}
