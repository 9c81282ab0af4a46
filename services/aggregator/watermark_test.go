package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

type streamMsg struct {
	seq     uint64
	subject string
	id      string // Nats-Msg-Id
	data    []byte
}

// rollupsStream returns every message on ROLLUPS, in stream order.
func (b *bed) rollupsStream(t *testing.T) []streamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, events.StreamRollups)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []streamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, streamMsg{seq: seq, subject: m.Subject, id: m.Header.Get(jetstream.MsgIDHeader), data: m.Data})
	}
	return out
}

// TestWatermarkFollowsPublishedRollups: the aggregator publishes its watermark on
// rollup.watermark.<consumer>, moving forward window by window, and no rollup of a window a
// watermark covers comes after it on the ROLLUPS stream (events published as they happen:
// an event reaching the stream after the watermark passed its window is late by definition).
func TestWatermarkFollowsPublishedRollups(t *testing.T) {
	watermarkFollows(t, "rollup.tokens.", func(b *bed, now time.Time) {
		var evs []events.RequestEvent
		for range 5 {
			evs = append(evs, events.RequestEvent{V: 1, EventID: events.NewEventID(), TS: now,
				Model: "m", Scene: "chat", Env: "prod", InputTokens: 10, OutputTokens: 5, TTFTMs: 20, TotalMs: 100, Status: events.StatusOK})
		}
		b.publish(t, evs)
	})
}

// TestWatermarkFollowsEngineRollups: engine rollups, which engine alerts and the TTFT alert's
// engine cause read, are covered by the watermark as the token rollups are.
func TestWatermarkFollowsEngineRollups(t *testing.T) {
	watermarkFollows(t, "rollup.engine.", func(b *bed, now time.Time) {
		ss := engineSamples(now, 2, 2)
		for i := range ss {
			ss[i].TS = now
		}
		b.publishEngine(t, ss)
	})
}

// watermarkFollows publishes, with publish, messages as they happen for six windows of 2 s,
// and checks that every window rollup on a subject starting with prefix is on ROLLUPS after a
// watermark that covers its window, and that the watermark moves with them.
func watermarkFollows(t *testing.T, prefix string, publish func(b *bed, now time.Time)) {
	b := newBed(t)
	startAggregator(t, b.env(envVars{"AGG_CONSUMER": "agg-a", "AGG_GPU": "false", "AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms"}))
	var last time.Time
	for end := time.Now().Add(12 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		now := time.Now().UTC().Add(-200 * time.Millisecond)
		publish(b, now)
		last = now.Truncate(2 * time.Second).Add(2 * time.Second) // end of the last window
	}
	var msgs []streamMsg
	deadline := time.Now().Add(time.Minute)
	for {
		msgs = b.rollupsStream(t)
		var w events.Watermark
		if n := len(msgs); n > 0 && msgs[n-1].subject == events.WatermarkSubject("agg-a") && json.Unmarshal(msgs[n-1].data, &w) == nil && !w.Through.Before(last) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no watermark through %s after a minute; the stream holds %d messages", last, len(msgs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	var marks []events.Watermark
	var covered time.Time // the highest watermark seen so far in stream order
	rollups := 0
	for _, m := range msgs {
		switch {
		case m.subject == "rollup.watermark.agg-a":
			var w events.Watermark
			if err := json.Unmarshal(m.data, &w); err != nil {
				t.Fatalf("watermark %d: %v", m.seq, err)
			}
			if w.V != 1 || w.Consumer != "agg-a" || w.WindowSeconds != 2 || w.Through.UnixNano()%int64(2*time.Second) != 0 || !w.Through.After(covered) {
				t.Errorf("watermark %d: %+v after one through %s", m.seq, w, covered)
			}
			covered = w.Through
			marks = append(marks, w)
		case strings.HasPrefix(m.subject, prefix):
			var r struct {
				WindowStart   time.Time `json:"window_start"`
				WindowSeconds int       `json:"window_seconds"`
				Kind          string    `json:"kind"`
			}
			if err := json.Unmarshal(m.data, &r); err != nil {
				t.Fatal(err)
			}
			rollups++
			if end := r.WindowStart.Add(time.Duration(r.WindowSeconds) * time.Second); r.Kind == events.KindWindow && !end.After(covered) {
				t.Errorf("rollup of the window ending %s (seq %d) after a watermark through %s", end, m.seq, covered)
			}
		}
	}
	if rollups < 6 || len(marks) < 2 {
		t.Errorf("%d rollups, %d watermarks: want every window and the watermark moving with them", rollups, len(marks))
	}
}

// TestWatermarkNeverGoesBackAcrossRestart: an aggregator publishes its watermark up to about
// now and stops; events of five minutes ago are then published, and a new process reads
// them first. It starts from the watermark the first published (the last on ROLLUPS): no
// watermark lower than that one goes out, and the old events' window, which it covers, comes
// as a correction, not as an ordinary window rollup behind it.
func TestWatermarkNeverGoesBackAcrossRestart(t *testing.T) {
	b := newBed(t)
	vars := b.env(envVars{"AGG_CONSUMER": "agg-w", "AGG_GPU": "false", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"})
	stop := startAggregator(t, vars)
	sent := 0
	var last time.Time // the end of the last window with events
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		evs := spreadEvents(10, time.Now().UTC().Add(-100*time.Millisecond))
		b.publish(t, evs)
		sent += len(evs)
		last = evs[len(evs)-1].TS.Truncate(2 * time.Second).Add(2 * time.Second)
	}
	lastMark := func() (w events.Watermark) {
		msgs := b.rollupsStream(t)
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].subject == events.WatermarkSubject("agg-w") {
				if err := json.Unmarshal(msgs[i].data, &w); err != nil {
					t.Fatal(err)
				}
				return w
			}
		}
		return w
	}
	// Every window closed and published: the floor is past every event, so the next process
	// reads the old events first.
	for deadline := time.Now().Add(30 * time.Second); lastMark().Through.Before(last); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no watermark through %s", last)
		}
	}
	stop()
	before := lastMark().Through

	old := spreadEvents(200, time.Now().UTC().Add(-5*time.Minute))
	b.publish(t, old)
	sent += len(old)
	startAggregator(t, vars)
	b.waitRows(t, time.Minute, uint64(sent), "SELECT sum(requests) FROM token_rollups")
	// The new process's watermark starts from the first's, and moves past it within seconds.
	for deadline := time.Now().Add(30 * time.Second); !lastMark().Through.After(before) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	checkRollupsPublished(t, b, "agg-w", uint64(sent))
	if w := lastMark(); !w.Through.After(before) {
		t.Errorf("30 s after the restart the last watermark is through %s, not past the first process's %s", w.Through, before)
	}
	// Only the old events' windows: a live event the first process took late on a loaded
	// machine is a correction too, and right.
	if n := b.scalar(t, fmt.Sprintf("SELECT sum(requests) FROM token_rollups WHERE kind = 'correction' AND window_start < toDateTime(%d)",
		before.Add(-time.Minute).Unix())); n != uint64(len(old)) {
		t.Errorf("%d requests in corrections, want the %d events of windows the watermark had passed", n, len(old))
	}
}

// TestWatermarkWaitsForBacklogAtStart: GPU samples of minutes ago, behind 30,000 invalid
// messages, wait in GPU_SAMPLES when the aggregator starts, beside live request events. The
// token pipeline reports its windows closed within a flush, well before the GPU pipeline has
// reached its first sample; the watermark must not pass the backlog's windows before their
// rollups are on ROLLUPS, or they would come after a watermark that covers them.
func TestWatermarkWaitsForBacklogAtStart(t *testing.T) {
	b := newBed(t)
	hosts := make([]string, 8)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("gpu-node-%d", i)
	}
	now := time.Now().UTC()
	// Ahead of the samples, invalid messages the GPU pipeline dead-letters one by one.
	b.publishInvalidGPU(t, 30_000)
	samples := gpuSamples(hosts, 4, now.Add(-5*time.Minute).Truncate(2*time.Second), 200) // 100 windows × 32 GPUs
	b.publishGPU(t, samples)
	b.publish(t, spreadEvents(10, now.Add(-3*time.Second)))
	sent := uint64(10)
	startAggregator(t, b.env(envVars{"AGG_CONSUMER": "agg-b", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"}))
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		b.publish(t, spreadEvents(10, time.Now().UTC().Add(-100*time.Millisecond)))
		sent += 10
	}
	b.waitRows(t, time.Minute, uint64(len(samples)), "SELECT sum(samples) FROM gpu_rollups")
	b.waitRows(t, time.Minute, sent, "SELECT sum(requests) FROM token_rollups")
	checkPublished(t, b, "agg-b", gpuRollups, uint64(len(samples)))
	checkRollupsPublished(t, b, "agg-b", sent)
}

// TestWatermarkPassesInvalidBacklog: a backlog at start of nothing but invalid messages,
// all dead-lettered, holds the watermark only until they are read: it then moves with the
// live request events, and the GPU pipeline no longer shows it held.
func TestWatermarkPassesInvalidBacklog(t *testing.T) {
	b := newBed(t)
	b.publishInvalidGPU(t, 100)
	addr := freeAddr(t)
	startAggregator(t, b.env(envVars{"HTTP_ADDR": addr, "AGG_CONSUMER": "agg-i", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"}))
	b.waitWatermarkPast(t, "agg-i", time.Now().UTC(), 30*time.Second)
	if want := `aggregator_watermark_held{stream="gpu"} 0`; !strings.Contains(metricsText(t, addr), want) {
		t.Errorf("/metrics does not say %s once the backlog was read", want)
	}
}

// TestWatermarkPassesDeletedBacklog: the last message of the backlog at start is removed
// from the stream before the aggregator reads it (by hand, as a poison message would be):
// the hold does not wait for it, and the watermark moves again once the rest is read.
func TestWatermarkPassesDeletedBacklog(t *testing.T) {
	b := newBed(t)
	b.publishInvalidGPU(t, 60000)
	ctx := context.Background()
	gpu, err := b.js.Stream(ctx, events.StreamGPU)
	if err != nil {
		t.Fatal(err)
	}
	last := gpu.CachedInfo().State.LastSeq
	addr := freeAddr(t)
	startAggregator(t, b.env(envVars{"HTTP_ADDR": addr, "AGG_CONSUMER": "agg-d", "AGG_ENGINE": "false", "AGG_FEEDBACK": "false",
		"AGG_WINDOW": "2s", "AGG_LATENESS": "1s", "AGG_FLUSH_INTERVAL": "100ms", "AGG_LOG_LEVEL": "warn"}))
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(metricsText(t, addr), `aggregator_watermark_held{stream="gpu"} 1`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the GPU pipeline never held the watermark for its backlog")
		}
	}
	if err := gpu.DeleteMsg(ctx, last); err != nil {
		t.Fatal(err)
	}
	b.waitWatermarkPast(t, "agg-d", time.Now().UTC(), 40*time.Second)
}

// waitWatermarkPast publishes live request events until consumer's watermark on ROLLUPS is
// past start, failing after within.
func (b *bed) waitWatermarkPast(t *testing.T, consumer string, start time.Time, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(100 * time.Millisecond) {
		b.publish(t, spreadEvents(10, time.Now().UTC().Add(-100*time.Millisecond)))
		var w events.Watermark
		msgs := b.rollupsStream(t)
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].subject == events.WatermarkSubject(consumer) {
				if err := json.Unmarshal(msgs[i].data, &w); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		if w.Through.After(start) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no watermark past %s in %s: the backlog held it (through %s)", start, within, w.Through)
		}
	}
}

// metricsText returns the aggregator's /metrics, empty while it does not answer yet.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// publishInvalidGPU publishes n messages on a GPU subject that are no valid sample.
func (b *bed) publishInvalidGPU(t *testing.T, n int) {
	t.Helper()
	publishAll(t, b.js, make([]int, n), func(*int) (string, string, []byte, error) {
		return events.GPUSampleSubject("gpu-node-0"), "", []byte(`{"v":1}`), nil
	})
}
