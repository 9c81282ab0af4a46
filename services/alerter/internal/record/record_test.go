package record

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

type msg struct {
	jetstream.Msg
	data                    []byte
	seq                     uint64
	acked, termd, progressd int
}

func (m *msg) Subject() string   { return "alerts.warning.r" }
func (m *msg) Data() []byte      { return m.data }
func (m *msg) Ack() error        { m.acked++; return nil }
func (m *msg) Term() error       { m.termd++; return nil }
func (m *msg) InProgress() error { m.progressd++; return nil }
func (m *msg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq}}, nil
}

// table is an alerts table whose inserts can fail after landing, as an insert whose client
// gave up while the server went on.
type table struct {
	rows       map[Key]int
	failWrite  int  // the next n writes fail
	landAnyway bool // and store their rows regardless
	failStored int  // the next n look-ups fail
	writes     int
	settled    []string
}

func (t *table) Stored(_ context.Context, keys []Key) (map[Key]bool, error) {
	if t.failStored > 0 {
		t.failStored--
		return nil, errors.New("ClickHouse away")
	}
	out := map[Key]bool{}
	for _, k := range keys {
		if t.rows[k] > 0 {
			out[k] = true
		}
	}
	return out, nil
}

func (t *table) Write(_ context.Context, _ string, alerts []events.Alert) error {
	t.writes++
	failed := t.failWrite > 0
	if failed {
		t.failWrite--
		if !t.landAnyway {
			return errors.New("ClickHouse away")
		}
	}
	for i := range alerts {
		t.rows[KeyOf(&alerts[i])]++
	}
	if failed {
		return errors.New("read timeout")
	}
	return nil
}

func (t *table) Settle(_ context.Context, id string) error {
	t.settled = append(t.settled, id)
	return nil
}

type dead struct{ msgs []*nats.Msg }

func (d *dead) PublishMsg(m *nats.Msg) error { d.msgs = append(d.msgs, m); return nil }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func alertMsg(t *testing.T, seq uint64, fp, state string, at time.Time) *msg {
	t.Helper()
	data, err := json.Marshal(events.Alert{V: 1, Fingerprint: fp, Rule: "ttft_p95_dynamic", State: state, Severity: "warning", At: at, WindowStart: at.Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	return &msg{data: data, seq: seq}
}

func msgs(ms ...*msg) []jetstream.Msg {
	out := make([]jetstream.Msg, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

// TestInsertThatLandedIsNotWrittenAgain: an insert reported failed that the server carried
// out anyway is waited for, found stored and not written again; the messages are
// acknowledged once, after that.
func TestInsertThatLandedIsNotWrittenAgain(t *testing.T) {
	at := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tb := &table{rows: map[Key]int{}, failWrite: 1, landAnyway: true}
	r := New(nil, tb, nil, Options{}, prometheus.NewRegistry(), discard)
	m1, m2 := alertMsg(t, 1, "f1", events.AlertFiring, at), alertMsg(t, 2, "f1", events.AlertResolved, at.Add(2*time.Minute))
	if !r.save(context.Background(), msgs(m1, m2)) {
		t.Fatal("not stored")
	}
	if len(tb.rows) != 2 || tb.rows[Key{Fingerprint: "f1", State: events.AlertFiring, At: at.Unix()}] != 1 {
		t.Fatalf("rows %v, want each state change once", tb.rows)
	}
	if tb.writes != 1 || len(tb.settled) != 1 {
		t.Errorf("%d writes, %d settles: the retry must settle the first attempt and find its rows", tb.writes, len(tb.settled))
	}
	if m1.acked != 1 || m2.acked != 1 || m1.progressd == 0 {
		t.Errorf("acked %d %d, in progress %d", m1.acked, m2.acked, m1.progressd)
	}
	if got := testutil.ToFloat64(r.errors); got != 1 {
		t.Errorf("store errors %v, want 1", got)
	}
	if got := testutil.ToFloat64(r.skipped.WithLabelValues(reasonStored)); got != 2 {
		t.Errorf("skipped{stored} %v, want 2", got)
	}
}

// TestNothingAckedUntilStored: while ClickHouse is away nothing is acknowledged; the batch
// is retried until it is stored, or left unacknowledged when the recorder stops.
func TestNothingAckedUntilStored(t *testing.T) {
	at := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tb := &table{rows: map[Key]int{}, failStored: 2}
	r := New(nil, tb, nil, Options{}, prometheus.NewRegistry(), discard)
	m1 := alertMsg(t, 1, "f1", events.AlertFiring, at)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r.save(ctx, msgs(m1)) || m1.acked != 0 {
		t.Fatalf("stopped recorder acked %d", m1.acked)
	}
	if !r.save(context.Background(), msgs(m1)) || m1.acked != 1 || len(tb.rows) != 1 {
		t.Fatalf("acked %d, rows %v", m1.acked, tb.rows)
	}
}

// TestBadAlertsDeadLettered: messages that cannot make a row are terminated, dead-lettered
// with their reason and counted; the good ones beside them are stored; the same state
// change twice in a batch makes one row.
func TestBadAlertsDeadLettered(t *testing.T) {
	at := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	tb, dl := &table{rows: map[Key]int{}}, &dead{}
	r := New(nil, tb, dl, Options{}, prometheus.NewRegistry(), discard)
	good, twice := alertMsg(t, 1, "f1", events.AlertFiring, at), alertMsg(t, 2, "f1", events.AlertFiring, at)
	malformed := &msg{data: []byte(`{"v":1,`), seq: 3}
	noState := alertMsg(t, 4, "f2", "maybe", at)
	noTime := alertMsg(t, 5, "f3", events.AlertFiring, time.Time{})
	if !r.save(context.Background(), msgs(good, twice, malformed, noState, noTime)) {
		t.Fatal("not stored")
	}
	if len(tb.rows) != 1 || good.acked != 1 || twice.acked != 1 {
		t.Fatalf("rows %v, acked %d %d", tb.rows, good.acked, twice.acked)
	}
	for _, m := range []*msg{malformed, noState, noTime} {
		if m.termd != 1 || m.acked != 0 {
			t.Errorf("message %d: terminated %d, acked %d", m.seq, m.termd, m.acked)
		}
	}
	if len(dl.msgs) != 3 || dl.msgs[0].Header.Get("Tokenscope-Reason") != reasonMalformed || dl.msgs[1].Header.Get("Tokenscope-Reason") != reasonInvalid {
		t.Errorf("%d dead letters", len(dl.msgs))
	}
	for reason, want := range map[string]float64{reasonMalformed: 1, reasonInvalid: 2, reasonStored: 1} {
		if got := testutil.ToFloat64(r.skipped.WithLabelValues(reason)); got != want {
			t.Errorf("skipped{%s} = %v, want %v", reason, got, want)
		}
	}
}

// limitedDead is a dead-letter subject on a server with a payload limit, which refuses a
// message over it as a *nats.Conn does.
type limitedDead struct {
	dead
	max int64
}

func (d *limitedDead) MaxPayload() int64 { return d.max }

func (d *limitedDead) PublishMsg(m *nats.Msg) error {
	size := len("NATS/1.0\r\n\r\n") + len(m.Data)
	for k, vs := range m.Header {
		for _, v := range vs {
			size += len(k) + len(v) + len(": \r\n")
		}
	}
	if int64(size) > d.max {
		return nats.ErrMaxPayload
	}
	return d.dead.PublishMsg(m)
}

// TestDeadLetterOverThePayloadLimit: an alert message near the payload limit that cannot
// make a row is dead-lettered with its reason and as much of its data as fits; with the
// headers added it was over the limit, refused, and lost.
func TestDeadLetterOverThePayloadLimit(t *testing.T) {
	dl := &limitedDead{max: 1024}
	r := New(nil, &table{rows: map[Key]int{}}, dl, Options{}, prometheus.NewRegistry(), discard)
	bad := &msg{data: []byte(`{"v":1,"summary":"` + strings.Repeat("x", 1000)), seq: 1}
	r.save(context.Background(), msgs(bad))
	if bad.termd != 1 || len(dl.msgs) != 1 {
		t.Fatalf("terminated %d, %d dead letters", bad.termd, len(dl.msgs))
	}
	if m := dl.msgs[0]; m.Header.Get("Tokenscope-Reason") != reasonMalformed || m.Header.Get("Tokenscope-Truncated") != strconv.Itoa(len(bad.data)) ||
		!bytes.HasPrefix(bad.data, m.Data) || len(m.Data) < 700 {
		t.Errorf("dead letter headers %v, %d bytes of data", m.Header, len(m.Data))
	}
}
