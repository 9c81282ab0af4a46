package record

import (
	"context"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// TestRowsKeepTheResolveReason: the alerts table holds why a resolved alert resolved, on
// ClickHouse 18.16 and on the current engine (chDB), and a firing row holds none. The
// column did not exist: a silent resolution read like a normal one in SQL.
func TestRowsKeepTheResolveReason(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	at := time.Date(2026, 3, 3, 12, 5, 0, 0, time.UTC)
	labels := map[string]string{"alertname": "ttft_p95_dynamic", "severity": "warning", "env": "prod", "scene": "chat"}
	alerts := []events.Alert{
		{V: 1, Fingerprint: "f1", Rule: "ttft_p95_dynamic", State: events.AlertFiring, Severity: "warning", Labels: labels,
			Value: 150, Threshold: 100, WindowStart: at.Add(-3 * time.Minute), StartsAt: at.Add(-2 * time.Minute), At: at.Add(-2 * time.Minute)},
		{V: 1, Fingerprint: "f1", Rule: "ttft_p95_dynamic", State: events.AlertResolved, Severity: "warning", Labels: labels,
			Value: 150, Threshold: 100, WindowStart: at.Add(-3 * time.Minute), StartsAt: at.Add(-2 * time.Minute), EndsAt: at, At: at,
			ResolveReason: events.ResolvedSilent},
	}
	want := map[string]string{events.AlertFiring: "", events.AlertResolved: events.ResolvedSilent}
	const q = "SELECT state, resolve_reason FROM alerts ORDER BY at"

	t.Run("18.16", func(t *testing.T) {
		cfg := testbed.ClickHouse(t)
		db, err := chdb.Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
			t.Fatal(err)
		}
		if err := NewStore(db.Conn()).Write(ctx, "q1", alerts); err != nil {
			t.Fatal(err)
		}
		rows, err := db.Conn().Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var state, reason string
			if err := rows.Scan(&state, &reason); err != nil {
				t.Fatal(err)
			}
			got[state] = reason
		}
		if len(got) != 2 || got[events.AlertFiring] != want[events.AlertFiring] || got[events.AlertResolved] != want[events.AlertResolved] {
			t.Errorf("rows %v, want %v", got, want)
		}
	})
	t.Run("current", func(t *testing.T) {
		cur := testbed.CurrentClickHouse(t)
		if _, err := chdb.MigrateOn(ctx, cur, cur.DB, cur.Version, schemas.Migrations()); err != nil {
			t.Fatal(err)
		}
		for i := range alerts {
			row, err := rowOf(&alerts[i])
			if err != nil {
				t.Fatal(err)
			}
			if err := cur.Insert(ctx, insertAlerts, row...); err != nil {
				t.Fatal(err)
			}
		}
		res, err := cur.Query(q, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, r := range res.Rows {
			got[r[0].(string)] = r[1].(string)
		}
		if len(got) != 2 || got[events.AlertFiring] != want[events.AlertFiring] || got[events.AlertResolved] != want[events.AlertResolved] {
			t.Errorf("rows %v, want %v", got, want)
		}
	})
}
