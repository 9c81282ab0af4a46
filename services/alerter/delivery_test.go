package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/schemas"
)

// deliveryBed is a NATS server and a ClickHouse database holding a week of history, with a
// client to publish rollups and inspect the streams.
type deliveryBed struct {
	ctx     context.Context
	js      jetstream.JetStream
	db      *chdb.DB
	environ map[string]string
	first   time.Time // start of the first window the test publishes
}

func newDeliveryBed(t *testing.T) *deliveryBed {
	t.Helper()
	chCfg := testbed.ClickHouse(t)
	ns := testbed.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if _, err := db.Migrate(ctx, schemas.Migrations()); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	seedHistory(t, ctx, db, now)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &deliveryBed{
		ctx: ctx, js: js, db: db,
		first: now.Add(-10 * time.Minute).Truncate(time.Minute),
		environ: map[string]string{
			"HTTP_ADDR":           "127.0.0.1:0",
			"NATS_URL":            ns.ClientURL(),
			"CLICKHOUSE_ADDR":     chCfg.Addr,
			"CLICKHOUSE_DB":       chCfg.DB,
			"CLICKHOUSE_USER":     chCfg.User,
			"CLICKHOUSE_PASSWORD": chCfg.Password,
			"ALERTER_SETTLE":      "200ms",
		},
	}
}

// with returns the environment with some variables changed.
func (b *deliveryBed) with(kv ...string) map[string]string {
	out := make(map[string]string, len(b.environ))
	for k, v := range b.environ {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// publish sends window i's rollup with its TTFT p95 and returns its stream sequence.
func (b *deliveryBed) publish(t *testing.T, i int, p95 float64) uint64 {
	t.Helper()
	r := tokenRollup(b.first.Add(time.Duration(i)*time.Minute), p95)
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := b.js.Publish(b.ctx, events.TokenRollupSubject(r.Env, r.Scene), data, jetstream.WithMsgID("w"+strconv.Itoa(i)))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

func (b *deliveryBed) window(i int) time.Time { return b.first.Add(time.Duration(i) * time.Minute) }

// consumer returns the alerter's consumer's state, or nil while it does not exist.
func (b *deliveryBed) consumer(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := b.js.Consumer(b.ctx, events.StreamRollups, "alerter")
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(b.ctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// alerts reads every message on the ALERTS stream.
func (b *deliveryBed) alerts(t *testing.T) []events.Alert {
	t.Helper()
	s, err := b.js.Stream(b.ctx, events.StreamAlerts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []events.Alert
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(b.ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		var a events.Alert
		if err := json.Unmarshal(m.Data, &a); err != nil {
			t.Fatalf("alert %d is not JSON: %v", seq, err)
		}
		out = append(out, a)
	}
	return out
}

// TestRestartEvaluatesWindowsLeftUnacked: windows that were delivered but still settling
// when the alerter stopped are evaluated, in order, as soon as it starts again, ahead of the
// windows published after the restart; before, JetStream redelivered them only after
// AckWait, after the newer window had been evaluated, and they were skipped as late.
func TestRestartEvaluatesWindowsLeftUnacked(t *testing.T) {
	b := newDeliveryBed(t)
	// A settle time longer than the test: both breaching windows are delivered and held.
	a := startAlerter(t, b.with("ALERTER_SETTLE", "10m"))
	waitFor(t, "the alerter's consumer", 30*time.Second, func() bool { return b.consumer(t) != nil })
	b.publish(t, 0, 3000)
	b.publish(t, 1, 3100)
	waitFor(t, "both rollups delivered and held", 30*time.Second, func() bool {
		c := b.consumer(t)
		return c != nil && c.NumAckPending == 2
	})
	a.stop(t)

	a = startAlerter(t, b.environ)
	last := b.publish(t, 2, 3200)
	// Windows 0 and 1 are two consecutive breaches: the alert fires at window 1.
	waitFor(t, "a firing alert", 30*time.Second, func() bool { return len(b.alerts(t)) > 0 })
	waitFor(t, "every rollup acknowledged", 30*time.Second, func() bool {
		c := b.consumer(t)
		return c != nil && c.NumAckPending == 0 && c.AckFloor.Stream == last
	})
	a.stop(t)
	got := b.alerts(t)
	if len(got) != 1 || got[0].State != events.AlertFiring || got[0].Rule != "ttft_p95_dynamic" {
		t.Fatalf("ALERTS holds %+v, want one firing ttft_p95_dynamic", got)
	}
	if !got[0].WindowStart.Equal(b.window(1)) || got[0].Value != 3100 {
		t.Errorf("fired at window %s with %v, want window 1 (%s) with 3100: the windows left unacked were not evaluated first",
			got[0].WindowStart, got[0].Value, b.window(1))
	}
}

// TestRollupsAckedOnlyAfterAlertsPublished: while the ALERTS stream cannot take the alert a
// window raised, that window's rollups stay unacknowledged; once it can, the alert is
// published exactly once and only then are they acknowledged.
func TestRollupsAckedOnlyAfterAlertsPublished(t *testing.T) {
	b := newDeliveryBed(t)
	a := startAlerter(t, b.environ)
	waitFor(t, "the alerter's consumer", 30*time.Second, func() bool { return b.consumer(t) != nil })
	// The alerter stops at start when ALERTS goes away before it has its consumer there.
	waitFor(t, "the alerter's consumer of ALERTS", 30*time.Second, func() bool {
		_, err := b.js.Consumer(b.ctx, events.StreamAlerts, "alerter-rows")
		return err == nil
	})
	if err := b.js.DeleteStream(b.ctx, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	s0 := b.publish(t, 0, 3000) // pending: no alert to publish, acknowledged
	s1 := b.publish(t, 1, 3100) // firing: cannot be published
	waitFor(t, "window 0 acknowledged", 30*time.Second, func() bool {
		c := b.consumer(t)
		return c != nil && c.AckFloor.Stream >= s0
	})
	// Window 1 settles in 200 ms; give the alerter many ticks to (wrongly) acknowledge it.
	time.Sleep(3 * time.Second)
	if c := b.consumer(t); c.AckFloor.Stream >= s1 || c.NumAckPending != 1 {
		t.Fatalf("ack floor %d, %d unacknowledged: window 1 (seq %d) was acknowledged though its alert was not published",
			c.AckFloor.Stream, c.NumAckPending, s1)
	}

	if err := bus.EnsureStreams(b.ctx, b.js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "window 1 acknowledged", 60*time.Second, func() bool {
		c := b.consumer(t)
		return c != nil && c.AckFloor.Stream >= s1 && c.NumAckPending == 0
	})
	got := b.alerts(t)
	if len(got) != 1 || got[0].State != events.AlertFiring || !got[0].WindowStart.Equal(b.window(1)) {
		t.Fatalf("ALERTS holds %+v, want the firing alert of window 1 once", got)
	}
	// The alerts table is written from the stream made again.
	waitFor(t, "the alert's row", 30*time.Second, func() bool { return b.alertRows(t)[alertKey(got[0])] == 1 })
	a.stop(t)
}

// TestOversizedLabelDoesNotBlockAlerting: a rollup put on ROLLUPS by hand with a model
// name of 5 MB breaches its SLA beside a real series breaching its baseline. Its alert,
// which carries the model in its labels and in its summary, would be over the server's
// payload limit (8 MB here, 1 MB by default), so no retry could publish it: taken, it held its window, and every later
// one, unacknowledged for good, and the real alert was never delivered. It is dead-lettered
// as invalid instead, and the real alert is delivered and its window acknowledged.
func TestOversizedLabelDoesNotBlockAlerting(t *testing.T) {
	b := newDeliveryBed(t)
	a := startAlerter(t, b.environ)
	waitFor(t, "the alerter's consumer", 30*time.Second, func() bool { return b.consumer(t) != nil })
	var last uint64
	for i := range 2 { // two breaching windows: both series fire at the second
		b.publish(t, i, 3000+float64(i)*100)
		r := tokenRollup(b.window(i), 9000)
		r.Model = strings.Repeat("m", 5<<20)
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := b.js.Publish(b.ctx, events.TokenRollupSubject(r.Env, r.Scene), data, jetstream.WithMsgID("huge"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	// Decoding megabytes of JSON is slow under the race detector on a loaded machine.
	waitFor(t, "every window delivered and acknowledged", 2*time.Minute, func() bool {
		c := b.consumer(t)
		return c != nil && c.NumAckPending == 0 && c.AckFloor.Stream == last
	})
	a.stop(t)
	got := b.alerts(t)
	if len(got) != 1 || got[0].Rule != "ttft_p95_dynamic" || got[0].Labels["model"] != "llama-3.1-70b" {
		t.Fatalf("ALERTS holds %d alerts (%v), want the real series' ttft_p95_dynamic firing alone", len(got), rulesOfAlerts(got))
	}
}

func rulesOfAlerts(alerts []events.Alert) []string {
	var out []string
	for _, a := range alerts {
		out = append(out, a.State+" "+a.Rule+" model of "+strconv.Itoa(len(a.Labels["model"]))+" bytes")
	}
	return out
}
