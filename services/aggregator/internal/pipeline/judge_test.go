package pipeline

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// TestReplayJudgesAsBefore: an event too far ahead of the clock when JetStream stored it
// is invalid, and stays so when a restart reads it again later, when the clock has caught
// up with its ts: validated as of the read, it was dead-lettered the first time and counted
// by the replay.
func TestReplayJudgesAsBefore(t *testing.T) {
	stored := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	cfg := window.Config{Window: 15 * time.Second, Lateness: 30 * time.Second, Buckets: events.DefaultBucketBounds(), MaxSeries: 100}
	ev := events.RequestEvent{V: 1, EventID: "01HZX3K9Q2W8V6B4N7M5C1D0EF", TS: stored.Add(6 * time.Minute), Model: "m", Scene: "s", Env: "e",
		InputTokens: 1, OutputTokens: 2, TTFTMs: 1, TotalMs: 2, Status: events.StatusOK}
	data := events.AppendRequest(nil, &ev)
	for _, read := range []time.Duration{0, 10 * time.Minute} {
		s := &tokenStage{agg: window.New(cfg, nil), dec: events.NewDecoder(10), cfg: cfg}
		if _, err := s.handle(data, 1, stored.Add(read), stored); err == nil {
			t.Errorf("read %s after it was stored: valid", read)
		}
	}
}

type replyMsg struct {
	jetstream.Msg
	reply string
}

func (m replyMsg) Reply() string { return m.reply }

func TestAckInfo(t *testing.T) {
	for _, reply := range []string{
		"$JS.ACK.LLM_EVENTS.agg-x_1.1.42.40.1764496800123456789.7",
		"$JS.ACK.hub.ACCHASH.LLM_EVENTS.agg-x_1.1.42.40.1764496800123456789.7.rnd",
	} {
		seq, stored, consumer, ok := ackInfo(replyMsg{reply: reply})
		if !ok || seq != 42 || consumer != "agg-x_1" || stored != 1764496800123456789 {
			t.Errorf("%s: seq %d, stored %d, consumer %q, ok %v", reply, seq, stored, consumer, ok)
		}
	}
}
