package replay

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

type memFeedback struct {
	mu  sync.Mutex
	fbs []events.FeedbackEvent
}

func (m *memFeedback) EmitFeedback(fb *events.FeedbackEvent, now time.Time) error {
	if err := fb.ValidateAt(now); err != nil {
		return err
	}
	m.mu.Lock()
	m.fbs = append(m.fbs, *fb)
	m.mu.Unlock()
	return nil
}

// TestUsersRateTheIncident replays the trace with a TTFT incident: the simulated users rate
// about the share asked, every verdict is about an emitted request, and thumbs up are far
// fewer for the incident's requests than for the others.
func TestUsersRateTheIncident(t *testing.T) {
	recs := openTrace(t, "AzureLLMInferenceTrace_conv.csv")[:3000]
	in, err := ParseIncident("start=2m,for=2m,ttft=20")
	if err != nil {
		t.Fatal(err)
	}
	var em memEmitter
	var fb memFeedback
	var st Stats
	Run(context.Background(), recs, Options{Speed: 10_000, Model: "llama", Scene: "support", Env: "test", Instance: "sim-1",
		Simulator: NewSimulator(DefaultModel, []Incident{in}, 7), Users: NewUsers(0.5, &fb, 7)}, &em, &st)
	byID := map[string]*events.RequestEvent{}
	for i := range em.evs {
		byID[em.evs[i].EventID] = &em.evs[i]
	}
	thumbs := 0
	var up, n [2]float64 // [normal, incident]
	for _, f := range fb.fbs {
		ev := byID[f.RequestID]
		if ev == nil || f.Scene != "support" || f.Source != events.SourceUser {
			t.Fatalf("verdict %+v is not about an emitted request", f)
		}
		if f.Name != "thumbs" {
			continue
		}
		thumbs++
		k := 0
		if ev.TTFTMs > 2000 {
			k = 1
		}
		n[k]++
		up[k] += f.Value
	}
	if thumbs < 1300 || thumbs > 1700 || st.Feedback.Load() != int64(len(fb.fbs)) || st.Unpublished.Load() != 0 {
		t.Fatalf("%d thumbs of 3000 requests at share 0.5; %d verdicts counted, %d unpublished", thumbs, st.Feedback.Load(), st.Unpublished.Load())
	}
	if n[1] < 50 || up[0]/n[0] < 0.8 || up[1]/n[1] > 0.55 {
		t.Fatalf("thumbs up: %.2f of %v normal, %.2f of %v slow", up[0]/n[0], n[0], up[1]/n[1], n[1])
	}
}
