package bus_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// TestBatchWaitsThroughNATSRestart publishes a batch three times the buffer while NATS is
// down: Publish waits for room instead of dropping, Wait returns only after NATS is back and
// has stored every message, each once.
func TestBatchWaitsThroughNATSRestart(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	port := srv.Addr().(*net.TCPAddr).Port
	p, js, reg, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 50, Batch: 8, AckTimeout: 200 * time.Millisecond},
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	defer func() { _ = stop() }()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	srv.Shutdown()
	srv.WaitForShutdown()
	const n = 150
	b := p.NewBatch()
	published := make(chan error, 1)
	go func() {
		for i := range n {
			if err := b.Publish(ctx, "llm.req.prod.chat", fmt.Sprint("id-", i), []byte(`{}`)); err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()
	waited := make(chan error, 1)
	go func() {
		if err := <-published; err != nil {
			waited <- err
			return
		}
		waited <- b.Wait(ctx)
	}()
	select {
	case err := <-waited:
		t.Fatalf("the batch was done while NATS was down: %v", err)
	case <-time.After(time.Second):
	}
	if p.Buffered() > 50 {
		t.Fatalf("holding %d messages with a buffer of 50", p.Buffered())
	}
	restarted := time.Now()
	testbed.StartNATS(t, filepath.Join(dir, "js"), port)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if time.Since(restarted) <= 0 || b.Pending() != 0 {
		t.Fatalf("%d messages still pending", b.Pending())
	}
	if d := metric(reg, "t_publish_dropped_total"); d != 0 {
		t.Fatalf("dropped %v", d)
	}
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("stream holds %d messages, want %d", info.State.Msgs, n)
	}
	seen := map[string]bool{}
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get(jetstream.MsgIDHeader)
		if seen[id] {
			t.Fatalf("%s stored twice", id)
		}
		seen[id] = true
	}
}

// TestBatchWaitSkipsLinger: a Batch's Wait has its messages published at once, not after
// the publisher's Linger, which would only delay the caller; a later plain Publish lingers
// again.
func TestBatchWaitSkipsLinger(t *testing.T) {
	srv := testbed.NATS(t)
	const linger = time.Hour
	p, _, reg, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{Buffer: 100, Linger: linger})
	defer func() { _ = stop() }()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := p.NewBatch()
	for i := range 3 {
		if err := b.Publish(ctx, "llm.req.prod.chat", fmt.Sprint("w-", i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatalf("Wait with a linger of %s: %v", linger, err)
	}
	if got := metric(reg, "t_published_total"); got != 3 {
		t.Fatalf("%v published, want 3", got)
	}
	p.Publish("llm.req.prod.chat", "plain", []byte(`{}`))
	time.Sleep(200 * time.Millisecond)
	if got := metric(reg, "t_published_total"); got != 3 {
		t.Fatalf("a plain publish did not linger: %v published", got)
	}
}

// TestBatchRefusedAndStopped: a message NATS can never take is counted in Wait's error, not
// waited on forever; once Run returns, Publish and Wait say so.
func TestBatchRefusedAndStopped(t *testing.T) {
	srv := testbed.StartNATS(t, filepath.Join(t.TempDir(), "js"), -1)
	p, js, _, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 64}); err != nil {
		t.Fatal(err)
	}
	b := p.NewBatch()
	if err := b.Publish(ctx, "llm.req.prod.chat", "ok-1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := b.Publish(ctx, "small.a", "big-1", make([]byte, 100)); err != nil { // over the stream's size limit
		t.Fatal(err)
	}
	err := b.Wait(ctx)
	if !errors.Is(err, bus.ErrRefused) || !strings.Contains(err.Error(), "refused 1 ") {
		t.Fatalf("Wait: %v, want 1 refused", err)
	}
	if err := b.Wait(ctx); !errors.Is(err, bus.ErrRefused) {
		t.Fatalf("a second Wait: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.NewBatch().Publish(ctx, "llm.req.prod.chat", "late", []byte(`{}`)); !errors.Is(err, bus.ErrStopped) {
		t.Fatalf("Publish after Run returned: %v", err)
	}
}

// TestBatchStoppedWithPending: Run giving up at shutdown with a batch's messages unpublished
// makes Wait return ErrStopped rather than block.
func TestBatchStoppedWithPending(t *testing.T) {
	dir := t.TempDir()
	srv := testbed.StartNATS(t, filepath.Join(dir, "js"), -1)
	p, _, _, stop := startPublisher(t, srv.ClientURL(), bus.PublisherOptions{FlushTimeout: 300 * time.Millisecond, AckTimeout: 100 * time.Millisecond},
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	srv.Shutdown()
	srv.WaitForShutdown()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := p.NewBatch()
	if err := b.Publish(ctx, "llm.req.prod.chat", "id-1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	go func() { _ = stop() }()
	if err := b.Wait(ctx); !errors.Is(err, bus.ErrStopped) {
		t.Fatalf("Wait: %v, want ErrStopped", err)
	}
}
