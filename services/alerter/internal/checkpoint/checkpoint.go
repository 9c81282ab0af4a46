package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

// Bucket is the key-value bucket the alerter keeps its checkpoints in, one key per durable
// consumer.
const Bucket = "ALERTER"

// ErrInvalid is returned by Load for a stored checkpoint that cannot be read.
var ErrInvalid = errors.New("invalid checkpoint")

// KV is a checkpoint in a JetStream key-value bucket.
type KV struct {
	kv  jetstream.KeyValue
	key string
}

type value struct {
	V           int       `json:"v"`
	WindowStart time.Time `json:"window_start"`
}

// Open creates or updates the bucket and returns the checkpoint stored under key (the
// consumer's name: letters, digits, - and _).
func Open(ctx context.Context, js jetstream.JetStream, key string, replicas int) (*KV, error) {
	kv, err := bus.EnsureKeyValue(ctx, js, Bucket, "tokenscope alerter: latest window evaluated and delivered, per consumer", replicas)
	if err != nil {
		return nil, err
	}
	return &KV{kv: kv, key: key}, nil
}

// Load returns the stored window start, or the zero time when none is stored.
func (c *KV) Load(ctx context.Context) (time.Time, error) {
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
	return v.WindowStart, nil
}

// Save stores windowStart; it returns once JetStream has it.
func (c *KV) Save(ctx context.Context, windowStart time.Time) error {
	data, err := json.Marshal(value{V: 1, WindowStart: windowStart.UTC()})
	if err != nil {
		return fmt.Errorf("cannot encode checkpoint: %w", err)
	}
	if _, err := c.kv.Put(ctx, c.key, data); err != nil {
		return fmt.Errorf("cannot save checkpoint %s/%s: %w", Bucket, c.key, err)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}
