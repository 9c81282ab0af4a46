package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Store writes alert rows to ClickHouse's alerts table.
type Store struct {
	conn driver.Conn
}

// NewStore returns a Store on conn.
func NewStore(conn driver.Conn) *Store { return &Store{conn: conn} }

const insertAlerts = `INSERT INTO alerts (at, fingerprint, rule, state, severity, labels, env, scene, model,
	bucket, instance, value, threshold, baseline_method, baseline_center, baseline_spread, window_start,
	starts_at, ends_at, summary)`

// Write inserts one row per alert state change.
func (s *Store) Write(ctx context.Context, alerts []events.Alert) error {
	if len(alerts) == 0 {
		return nil
	}
	b, err := s.conn.PrepareBatch(ctx, insertAlerts)
	if err != nil {
		return fmt.Errorf("cannot prepare insert into alerts: %w", err)
	}
	defer b.Abort()
	for i := range alerts {
		a := &alerts[i]
		labels, err := json.Marshal(a.Labels)
		if err != nil {
			return fmt.Errorf("cannot encode labels of alert %s: %w", a.Fingerprint, err)
		}
		l := a.Labels
		err = b.Append(a.At.UTC(), a.Fingerprint, a.Rule, a.State, a.Severity, string(labels),
			l["env"], l["scene"], l["model"], l["bucket"], l["instance"],
			finite(a.Value), finite(a.Threshold), a.BaselineMethod, finite(a.BaselineCenter), finite(a.BaselineSpread),
			dt(a.WindowStart), dt(a.StartsAt), dt(a.EndsAt), a.Summary)
		if err != nil {
			return fmt.Errorf("cannot append alert %s to the batch: %w", a.Fingerprint, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into alerts: %w", len(alerts), err)
	}
	return nil
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
