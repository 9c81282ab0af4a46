package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// seedBusinessHistory writes a week of one-minute feedback and token rollups of the support
// scene around the current time of day, as the aggregator would have: satisfaction (thumbs
// up among 40 verdicts a minute, over two models) about 0.8, completion about 0.9.
func seedBusinessHistory(t *testing.T, ctx context.Context, db *chdb.DB, now time.Time) {
	t.Helper()
	fb, err := db.Conn().PrepareBatch(ctx, `INSERT INTO feedback_rollups (window_start, window_seconds, kind, env, scene, model, name, source, count, positive)`)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := db.Conn().PrepareBatch(ctx, `INSERT INTO token_rollups (window_start, window_seconds, kind, env, scene, model, instance, bucket, requests, ok, completed, abandoned)`)
	if err != nil {
		t.Fatal(err)
	}
	for d := 1; d <= 7; d++ {
		for m := -40; m <= 40; m++ {
			start := now.AddDate(0, 0, -d).Add(time.Duration(m) * time.Minute).Truncate(time.Minute)
			j := uint64((m + 40 + d) % 3) // 0 to 2
			for _, model := range []string{"qwen", "llama"} {
				if err := fb.Append(start, uint32(60), events.KindWindow, "prod", "support", model, "thumbs", "user", uint64(20), 15+j); err != nil {
					t.Fatal(err)
				}
			}
			// Another verdict name is not satisfaction.
			if err := fb.Append(start, uint32(60), events.KindWindow, "prod", "support", "qwen", "rating", "user", uint64(30), uint64(0)); err != nil {
				t.Fatal(err)
			}
			if err := tok.Append(start, uint32(60), events.KindWindow, "prod", "support", "qwen", "", "0-499", uint64(100), uint64(100), 44+j, 6-j); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := fb.Send(); err != nil {
		t.Fatal(err)
	}
	if err := tok.Send(); err != nil {
		t.Fatal(err)
	}
}

// TestBusinessAlertsEndToEnd runs the alerter against the real NATS and ClickHouse: a week
// of feedback_rollups and token_rollups gives the support scene's satisfaction and
// completion baselines; two windows of feedback rollups published with half the usual
// thumbs up fire satisfaction_dynamic on alerts.warning.satisfaction_dynamic, with the
// scene's labels and the baseline's figures; completion stays normal until two windows of
// abandoned conversations fire completion_rate_dynamic.
func TestBusinessAlertsEndToEnd(t *testing.T) {
	chCfg := testbed.ClickHouse(t)
	ns := testbed.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	seedBusinessHistory(t, ctx, db, now)

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string][]events.Alert{} // by subject
	sub, err := nc.Subscribe(events.SubjectAlertsAll, func(m *nats.Msg) {
		var a events.Alert
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Errorf("alert on %s is not JSON: %v", m.Subject, err)
			return
		}
		mu.Lock()
		got[m.Subject] = append(got[m.Subject], a)
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	alerts := func(subject string) []events.Alert {
		mu.Lock()
		defer mu.Unlock()
		return append([]events.Alert(nil), got[subject]...)
	}

	environ := map[string]string{
		"HTTP_ADDR": "127.0.0.1:0", "NATS_URL": ns.ClientURL(),
		"CLICKHOUSE_ADDR": chCfg.Addr, "CLICKHOUSE_DB": chCfg.DB, "CLICKHOUSE_USER": chCfg.User, "CLICKHOUSE_PASSWORD": chCfg.Password,
		"ALERTER_SETTLE": "200ms",
	}
	startAlerter(t, environ)
	waitFor(t, "the alerter's consumer", 30*time.Second, func() bool {
		_, err := js.Consumer(ctx, events.StreamRollups, "alerter")
		return err == nil
	})

	first := now.Add(-10 * time.Minute).Truncate(time.Minute)
	publish := func(i int, up uint64, completed uint64) {
		t.Helper()
		start := first.Add(time.Duration(i) * time.Minute)
		for j, model := range []string{"qwen", "llama"} {
			r := events.FeedbackRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow,
				Env: "prod", Scene: "support", Model: model, Name: "thumbs", Source: "user", Count: 20, Positive: up / 2, Sum: float64(up / 2)}
			data, _ := json.Marshal(r)
			if _, err := js.Publish(ctx, events.FeedbackRollupSubject(r.Env, r.Scene), data, jetstream.WithMsgID(fmt.Sprintf("f%d-%d", i, j))); err != nil {
				t.Fatal(err)
			}
		}
		r := events.TokenRollup{V: 1, WindowStart: start, WindowSeconds: 60, Kind: events.KindWindow, Env: "prod", Scene: "support",
			Model: "qwen", Bucket: "0-499", Layer: events.LayerGateway, Requests: 100, OK: 100, Completed: completed, Abandoned: 50 - completed}
		data, _ := json.Marshal(r)
		if _, err := js.Publish(ctx, events.TokenRollupSubject(r.Env, r.Scene), data, jetstream.WithMsgID(fmt.Sprintf("t%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	satSubject := events.AlertSubject(events.SeverityWarning, "satisfaction_dynamic")
	compSubject := events.AlertSubject(events.SeverityWarning, "completion_rate_dynamic")
	publish(0, 32, 45) // normal
	publish(1, 16, 45) // satisfaction 0.4: pending
	publish(2, 14, 45) // firing
	waitFor(t, "satisfaction_dynamic firing", 30*time.Second, func() bool { return len(alerts(satSubject)) >= 1 })
	a := alerts(satSubject)[0]
	if a.State != events.AlertFiring || a.Labels["scene"] != "support" || a.Labels["env"] != "prod" || a.Labels["model"] != "" ||
		!a.WindowStart.Equal(first.Add(2*time.Minute)) || a.Value != 14.0/40 {
		t.Errorf("satisfaction alert %+v", a)
	}
	if a.BaselineMethod != "median_mad" || a.BaselineCenter < 0.75 || a.BaselineCenter > 0.85 || a.BaselineSpread <= 0 || a.Threshold >= a.BaselineCenter {
		t.Errorf("baseline %s center %v spread %v threshold %v, want median_mad near 0.8", a.BaselineMethod, a.BaselineCenter, a.BaselineSpread, a.Threshold)
	}
	if n := len(alerts(compSubject)); n != 0 {
		t.Errorf("%d completion alerts while completion was normal", n)
	}
	publish(3, 14, 30) // completion 0.6 against about 0.9
	publish(4, 14, 28)
	waitFor(t, "completion_rate_dynamic firing", 30*time.Second, func() bool { return len(alerts(compSubject)) >= 1 })
	c := alerts(compSubject)[0]
	if c.State != events.AlertFiring || c.Labels["scene"] != "support" || c.BaselineCenter < 0.85 || c.BaselineCenter > 0.95 || c.Value != 28.0/50 {
		t.Errorf("completion alert %+v", c)
	}
	if n := len(alerts(satSubject)); n != 1 {
		t.Errorf("satisfaction sent %d times while firing, want once", n)
	}
}
