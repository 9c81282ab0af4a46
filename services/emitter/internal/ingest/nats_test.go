package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
)

// TestIngestNATSGoesAway stops NATS right after a batch is accepted, while the publisher
// still holds some of it, and keeps posting with X-Tokenscope-Ack: buffered: events are
// accepted while the buffer has room, refused from the first that does not fit on (503 once none fits), and every
// accepted event is in LLM_EVENTS once NATS is back. The client sending a refused batch
// again loses nothing, and what got through twice is dropped by its id.
func TestIngestNATSGoesAway(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 64 << 20, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	pubReg := prometheus.NewRegistry()
	const buffer = 1500
	pub := bus.NewPublisher(js, bus.PublisherOptions{Buffer: buffer, Batch: 64, AckTimeout: 300 * time.Millisecond, Namespace: "t"}, pubReg, logger)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(runCtx) }()
	ingest := New(Options{MaxBytes: 16 << 20}, pub, time.Now, nil, logger)
	h := buffered(ingest)

	ts := time.Now().UTC().Format(events.TimeLayout)
	mk := func(k, n int) string {
		var sb strings.Builder
		for i := range n {
			fmt.Fprintf(&sb, `{"v":1,"event_id":"b%d-%d","ts":%q,"model":"m","scene":"chat","env":"prod","input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":2,"status":"ok"}`+"\n", k, i, ts)
		}
		return sb.String()
	}
	accepted := 0
	code, a := post(h, mk(1, 1000))
	if code != 202 || a.Accepted != 1000 {
		t.Fatalf("first batch: %d %+v", code, a)
	}
	accepted += a.Accepted
	srv.Shutdown()
	srv.WaitForShutdown()
	waitFor(t, func() bool { return !nc.IsConnected() })
	time.Sleep(100 * time.Millisecond) // the publisher has read the acks that came before
	heldAtStop := pub.Buffered()

	second := mk(2, 2000)
	code, a = post(h, second)
	// Acks read late can only free room while NATS is away, never take it.
	if code != 202 || a.Accepted < buffer-heldAtStop || a.Accepted > buffer || a.Rejected != 2000-a.Accepted || a.Rejected == 0 {
		t.Fatalf("second batch with %d held: %d accepted %d rejected %d", heldAtStop, code, a.Accepted, a.Rejected)
	}
	accepted += a.Accepted
	if len(a.Errors) == 0 || a.Errors[0].Index != a.Accepted || !strings.Contains(a.Errors[0].Error, "publish buffer full") {
		t.Fatalf("second batch errors %+v", a.Errors[:min(len(a.Errors), 2)])
	}
	code, a = post(h, mk(3, 10))
	if code != 503 || a.Accepted != 0 || a.Rejected != 10 {
		t.Fatalf("third batch, buffer full: %d %+v", code, a)
	}
	if got := testutil.ToFloat64(ingest.rejected.WithLabelValues("dropped")); got != float64(3000-accepted+10) {
		t.Fatalf("rejected{reason=dropped} = %v, want %d", got, 3000-accepted+10)
	}

	testbed.StartNATS(t, filepath.Join(dir, "js"), port)
	waitStream(t, js, uint64(accepted))
	// The client sends the second batch again: what was refused lands, the rest is
	// dropped by JetStream as duplicates.
	waitFor(t, func() bool { return pub.Buffered() == 0 })
	// It resends what was refused, as the README says: everything from the first refused
	// index on (the batch is larger than the buffer, so one post may not take it whole).
	rest := strings.SplitAfter(strings.TrimSuffix(second, "\n"), "\n")
	for tries := 0; ; tries++ {
		code, a = post(h, strings.Join(rest, ""))
		if code == 202 && a.Rejected == 0 {
			break
		}
		if tries == 500 || (code != 202 && code != 503) {
			t.Fatalf("second batch again: %d accepted %d rejected %d", code, a.Accepted, a.Rejected)
		}
		if code == 202 {
			if len(a.Errors) == 0 || a.Errors[0].Index != a.Accepted {
				t.Fatalf("refused events are not the end of the batch: %+v", a.Errors[:min(len(a.Errors), 2)])
			}
			rest = rest[a.Accepted:]
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitStream(t, js, 3000)
	waitFor(t, func() bool { return pub.Buffered() == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := metric(t, pubReg, "t_published_total") + metric(t, pubReg, "t_published_duplicate_total"); d < 3000 {
		t.Fatalf("publisher acknowledged %v, want at least 3000", d)
	}
}

// buffered asks h for answers once the publisher holds the events (emit.AckBuffered).
func buffered(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set(emit.AckHeader, emit.AckBuffered)
		h.ServeHTTP(w, r)
	})
}

func waitStream(t *testing.T, js jetstream.JetStream, want uint64) {
	t.Helper()
	var got uint64
	waitFor(t, func() bool {
		s, err := js.Stream(context.Background(), events.StreamEvents)
		if err != nil {
			return false
		}
		info, err := s.Info(context.Background())
		if err != nil {
			return false
		}
		got = info.State.Msgs
		if got > want {
			t.Fatalf("%s holds %d messages, more than %d", events.StreamEvents, got, want)
		}
		return got == want
	})
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
	}
}

func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// BenchmarkFeedbackIngestNATS measures POST /v1/feedback into the real JetStream: NDJSON
// batches of 1000 through the handler and the publisher, timed until the FEEDBACK stream
// holds every event.
func BenchmarkFeedbackIngestNATS(b *testing.B) {
	srv := testbed.StartNATS(b, filepath.Join(b.TempDir(), "js"), -1)
	ctx := context.Background()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 4 << 30, DuplicateWindow: time.Minute, Replicas: 1}, events.StreamFeedback); err != nil {
		b.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	pub := bus.NewPublisher(js, bus.PublisherOptions{Namespace: "b"}, nil, logger)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = pub.Run(runCtx) }()
	h := NewFeedback(Options{MaxBytes: 16 << 20}, pub, time.Now, nil, logger)
	ts := time.Now().UTC().Format(events.TimeLayout)
	const batch = 1000
	b.ReportAllocs()
	sent := 0
	start := time.Now()
	for b.Loop() {
		var sb strings.Builder
		for i := range batch {
			fmt.Fprintf(&sb, `{"v":1,"event_id":"fb-%d-%d","ts":%q,"request_id":"req-%d","name":"thumbs","value":1,"source":"user","scene":"chat","env":"prod"}`+"\n", sent, i, ts, i)
		}
		// A client resends what the full buffer refused: everything from the first refused on.
		rest := sb.String()
		for {
			r := h.ingest(context.Background(), []byte(rest), time.Now(), nil)
			if r.Rejected == 0 {
				break
			}
			if r.Rejected != r.dropped {
				b.Fatalf("%+v", r.Answer)
			}
			for range r.Accepted {
				rest = rest[strings.IndexByte(rest, '\n')+1:]
			}
			time.Sleep(time.Millisecond) // wait for acks to free room
		}
		sent++
	}
	s, _ := js.Stream(ctx, events.StreamFeedback)
	for {
		info, err := s.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if info.State.Msgs == uint64(sent*batch) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Until the last event is in the stream, not only handed to the publisher.
	b.ReportMetric(float64(sent*batch)/time.Since(start).Seconds(), "events/s")
}

// TestIngestAckStored: by default, as with X-Tokenscope-Ack: stored, the answer comes once
// JetStream has stored every accepted event (200, "stored"), and while NATS is away it is a retryable 503
// once the wait is over, never a 2xx for events only the emitter holds: an emitter killed
// after answering loses none of them. The same batch sent again once NATS is back is
// stored once.
func TestIngestAckStored(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pub, js := testbed.Publisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 10000, Batch: 64, AckTimeout: 300 * time.Millisecond}, events.StreamEvents)
	nc := js.Conn()
	logger := slog.New(slog.DiscardHandler)
	h := New(Options{MaxBytes: 16 << 20, StoreWait: time.Second}, pub, time.Now, nil, logger)
	ts := time.Now().UTC().Format(events.TimeLayout)
	mk := func(k, n int) string {
		var sb strings.Builder
		for i := range n {
			fmt.Fprintf(&sb, `{"v":1,"event_id":"s%d-%d","ts":%q,"model":"m","scene":"chat","env":"prod","input_tokens":1,"output_tokens":2,"ttft_ms":1,"total_ms":2,"status":"ok"}`+"\n", k, i, ts)
		}
		return sb.String()
	}
	ask := "" // the default first
	postStored := func(body string) (int, Answer, http.Header) {
		req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body))
		if ask != "" {
			req.Header.Set("X-Tokenscope-Ack", ask)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var a Answer
		_ = json.Unmarshal(rec.Body.Bytes(), &a)
		return rec.Code, a, rec.Header()
	}
	stream, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	stored := func() uint64 {
		info, err := stream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}

	code, a, _ := postStored(mk(1, 500) + "{oops\n")
	if code != http.StatusOK || a.Accepted != 500 || a.Stored != 500 || a.Rejected != 1 {
		t.Fatalf("NATS up: %d %+v", code, a)
	}
	if n := stored(); n != 500 { // at the answer, not later
		t.Fatalf("answered stored with %d of 500 in the stream", n)
	}
	ask = "stored"

	srv.Shutdown()
	srv.WaitForShutdown()
	waitFor(t, func() bool { return !nc.IsConnected() })
	second := mk(2, 300)
	code, a, header := postStored(second)
	if code != http.StatusServiceUnavailable || a.Stored != 0 || header.Get("Retry-After") != "1" || !strings.Contains(a.Error, "send the request again") {
		t.Fatalf("NATS away: %d %+v", code, a)
	}

	testbed.StartNATS(t, filepath.Join(dir, "js"), port)
	waitFor(t, func() bool { return nc.IsConnected() })
	code, a, _ = postStored(second)
	if code != http.StatusOK || a.Stored != 300 {
		t.Fatalf("sent again: %d %+v", code, a)
	}
	if js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	if stream, err = js.Stream(ctx, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if n := stored(); n != 800 {
		t.Fatalf("%d events stored, want 800", n)
	}

	// A publisher that cannot say what is stored is not waited for: the client is told.
	code, a = func() (int, Answer) {
		req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(mk(3, 1)))
		req.Header.Set("X-Tokenscope-Ack", "stored")
		rec := httptest.NewRecorder()
		newHandler(&memPub{}).ServeHTTP(rec, req)
		var a Answer
		_ = json.Unmarshal(rec.Body.Bytes(), &a)
		return rec.Code, a
	}()
	if code != http.StatusBadRequest || a.Accepted != 0 {
		t.Fatalf("memPub: %d %+v", code, a)
	}
}
