package main

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// relay forwards TCP connections to a server until it is cut: then it closes every
// connection it carries and refuses new ones (accepted and closed at once), as a server
// gone from the network looks to its clients.
type relay struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go r.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		r.cut(true)
	})
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		down := r.down
		if !down {
			r.conns[c] = true
		}
		r.mu.Unlock()
		if down {
			_ = c.Close()
			continue
		}
		go r.pipe(c)
	}
}

func (r *relay) pipe(c net.Conn) {
	s, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	r.mu.Lock()
	if r.down {
		r.mu.Unlock()
		_ = c.Close()
		_ = s.Close()
		return
	}
	r.conns[s] = true
	r.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, s); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = s.Close()
}

// cut takes the server off the network (down) or puts it back.
func (r *relay) cut(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
	if down {
		for c := range r.conns {
			_ = c.Close()
			delete(r.conns, c)
		}
	}
}

// alertRows returns the alerts table's rows as fingerprint/state/at keys, with how often
// each occurs.
func (b *deliveryBed) alertRows(t *testing.T) map[string]int {
	t.Helper()
	rows, err := b.db.Conn().Query(b.ctx, "SELECT fingerprint, state, toUInt32(toDateTime(at)) FROM alerts")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var fp, state string
		var at uint32
		if err := rows.Scan(&fp, &state, &at); err != nil {
			t.Fatal(err)
		}
		out[fp+"-"+state+"-"+time.Unix(int64(at), 0).UTC().Format(time.RFC3339)]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func alertKey(a events.Alert) string {
	return a.Fingerprint + "-" + a.State + "-" + a.At.UTC().Truncate(time.Second).Format(time.RFC3339)
}

// TestAlertRowsCatchUpAfterClickHouseOutage: with ClickHouse unreachable while an alert
// fires, resolves, fires again and resolves again, the alerts still go out on the stream;
// the alerter is restarted before ClickHouse is back; once it is, the alerts table gets
// every state change, once. A replay of the whole stream into the table (the rows
// consumer gone, as after a crash between insert and ack) writes nothing twice. Before, the
// rows were given up after three attempts and the table kept none of them.
func TestAlertRowsCatchUpAfterClickHouseOutage(t *testing.T) {
	b := newDeliveryBed(t)
	ch := startRelay(t, b.environ["CLICKHOUSE_ADDR"])
	environ := b.with("CLICKHOUSE_ADDR", ch.addr())
	a := startAlerter(t, environ)
	waitFor(t, "the alerter's consumer", 30*time.Second, func() bool { return b.consumer(t) != nil })

	ch.cut(true)
	// Fires at window 1, resolves at 3, fires again at 5, resolves at 7.
	for i, p95 := range []float64{3000, 3100, 480, 510, 3200, 3300, 490, 500} {
		b.publish(t, i, p95)
	}
	waitFor(t, "four alert state changes on ALERTS", 60*time.Second, func() bool { return len(b.alerts(t)) == 4 })
	time.Sleep(2 * time.Second) // the recorder tries, and fails, meanwhile
	a.stop(t)
	if got := b.alertRows(t); len(got) != 0 {
		t.Fatalf("the alerts table holds %v while ClickHouse was unreachable", got)
	}

	ch.cut(false)
	a = startAlerter(t, environ)
	want := map[string]int{}
	for _, al := range b.alerts(t) {
		want[alertKey(al)]++
	}
	if len(want) != 4 {
		t.Fatalf("ALERTS holds %d distinct state changes, want 4: %v", len(want), want)
	}
	exact := func() bool {
		got := b.alertRows(t)
		if len(got) != len(want) {
			return false
		}
		for k, n := range got {
			if n != 1 || want[k] != 1 {
				return false
			}
		}
		return true
	}
	waitFor(t, "every state change in the alerts table once", 60*time.Second, exact)
	waitFor(t, "every alert message acknowledged", 30*time.Second, func() bool {
		i := b.rowsConsumer(t)
		return i != nil && i.NumAckPending == 0 && i.NumPending == 0
	})
	a.stop(t)

	// The whole stream again: nothing is written twice.
	if err := b.js.DeleteConsumer(b.ctx, events.StreamAlerts, "alerter-rows"); err != nil {
		t.Fatal(err)
	}
	a = startAlerter(t, environ)
	waitFor(t, "the replayed stream acknowledged", 30*time.Second, func() bool {
		i := b.rowsConsumer(t)
		return i != nil && i.Delivered.Stream >= 4 && i.NumAckPending == 0 && i.NumPending == 0
	})
	a.stop(t)
	if !exact() {
		t.Fatalf("after a replay of ALERTS the table holds %v, want each of %v once", b.alertRows(t), want)
	}
}

// rowsConsumer returns the state of the consumer writing the alerts table, or nil.
func (b *deliveryBed) rowsConsumer(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := b.js.Consumer(b.ctx, events.StreamAlerts, "alerter-rows")
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.WithoutCancel(b.ctx))
	if err != nil {
		t.Fatal(err)
	}
	return info
}
