package record

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// Key identifies one alert state change: what its Nats-Msg-Id says, at whole seconds, as
// the alerts table's at column holds it on every server version.
type Key struct {
	Fingerprint, State string
	At                 int64 // unix seconds
}

// KeyOf returns a's key.
func KeyOf(a *events.Alert) Key {
	return Key{Fingerprint: a.Fingerprint, State: a.State, At: a.At.Unix()}
}

// Store writes alert rows to ClickHouse's alerts table.
type Store struct {
	conn driver.Conn
}

// NewStore returns a Store on conn.
func NewStore(conn driver.Conn) *Store { return &Store{conn: conn} }

const insertAlerts = `INSERT INTO alerts (at, fingerprint, rule, state, severity, labels, env, scene, model,
	bucket, instance, value, threshold, baseline_method, baseline_center, baseline_spread, window_start,
	starts_at, ends_at, summary, resolve_reason)`

// Write inserts one row per alert state change, tagged with queryID so that Settle can
// tell when an attempt abandoned by its client has finished on the server.
func (s *Store) Write(ctx context.Context, queryID string, alerts []events.Alert) error {
	if len(alerts) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(clickhouse.Context(ctx, clickhouse.WithQueryID(queryID)), insertAlerts)
	if err != nil {
		return fmt.Errorf("cannot prepare insert into alerts: %w", err)
	}
	defer b.Abort()
	for i := range alerts {
		row, err := rowOf(&alerts[i])
		if err != nil {
			return err
		}
		if err := b.Append(row...); err != nil {
			return fmt.Errorf("cannot append alert %s to the batch: %w", alerts[i].Fingerprint, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into alerts: %w", len(alerts), err)
	}
	return nil
}

// rowOf returns a's row, in insertAlerts' columns.
func rowOf(a *events.Alert) ([]any, error) {
	labels, err := json.Marshal(a.Labels)
	if err != nil {
		return nil, fmt.Errorf("cannot encode labels of alert %s: %w", a.Fingerprint, err)
	}
	l := a.Labels
	return []any{a.At.UTC(), a.Fingerprint, a.Rule, a.State, a.Severity, string(labels),
		l["env"], l["scene"], l["model"], l["bucket"], l["instance"],
		finite(a.Value), finite(a.Threshold), a.BaselineMethod, finite(a.BaselineCenter), finite(a.BaselineSpread),
		dt(a.WindowStart), dt(a.StartsAt), dt(a.EndsAt), a.Summary, a.ResolveReason}, nil
}

// Stored returns which of keys the alerts table holds already.
func (s *Store) Stored(ctx context.Context, keys []Key) (map[Key]bool, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	lo, hi := keys[0].At, keys[0].At
	fps := make([]string, 0, len(keys))
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		lo, hi = min(lo, k.At), max(hi, k.At)
		if !seen[k.Fingerprint] {
			seen[k.Fingerprint] = true
			fps = append(fps, k.Fingerprint)
		}
	}
	// at is the partition key: the range keeps the read to the batch's months.
	// toDateTime(at) is at to the second on servers where at is DateTime64.
	q := fmt.Sprintf(`SELECT fingerprint, state, toUInt32(toDateTime(at)) FROM alerts
		WHERE at >= toDateTime(%d) AND at < toDateTime(%d) AND has(?, fingerprint)`, max(lo, 0), hi+1)
	rows, err := s.conn.Query(ctx, q, fps)
	if err != nil {
		return nil, fmt.Errorf("cannot read the stored alert rows: %w", err)
	}
	defer rows.Close()
	want := make(map[Key]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	got := map[Key]bool{}
	for rows.Next() {
		var k Key
		var at uint32
		if err := rows.Scan(&k.Fingerprint, &k.State, &at); err != nil {
			return nil, fmt.Errorf("cannot read the stored alert rows: %w", err)
		}
		k.At = int64(at)
		if want[k] {
			got[k] = true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the stored alert rows: %w", err)
	}
	return got, nil
}

// Settle waits, up to ctx, until no query tagged queryID runs on the server: an insert
// abandoned by its client may still land, so what is stored is only known once it ended.
func (s *Store) Settle(ctx context.Context, queryID string) error {
	return chdb.Settle(ctx, s.conn, queryID)
}

// dt maps the zero time to the epoch, which DateTime can hold.
func dt(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return t.UTC()
}

func finite(v float64) float64 {
	if v != v || v > 1e308 || v < -1e308 {
		return 0
	}
	return v
}
