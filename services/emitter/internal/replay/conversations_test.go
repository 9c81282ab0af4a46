package replay

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// TestConversationsOfASimulatedReplay: every simulated request is a turn of a conversation,
// turns count 1, 2, … in order, each ended conversation has one outcome, on its last turn,
// conversations last about the mean asked, those that met the TTFT incident complete far
// less often, and a fifth of the ok answers carry a quality score.
func TestConversationsOfASimulatedReplay(t *testing.T) {
	recs := Generate(Conversation, 10*time.Minute, 5)
	in, err := ParseIncident("start=4m,for=3m,ttft=20")
	if err != nil {
		t.Fatal(err)
	}
	var em memEmitter
	var fb memFeedback
	var st Stats
	Run(context.Background(), recs, Options{Speed: 100_000, Model: "llama", Scene: "support", Env: "test", Instance: "sim-1",
		Simulator: NewSimulator(DefaultModel, []Incident{in}, 7), Users: NewUsers(0.3, &fb, 7),
		Conversations: NewConversations(4, 7)}, &em, &st)
	if len(em.evs) != len(recs) || st.Unpublished.Load() != 0 {
		t.Fatalf("%d events of %d requests, %d unpublished", len(em.evs), len(recs), st.Unpublished.Load())
	}
	type conv struct {
		turns, outcomes, lastOutcomeTurn int
		outcome                          events.Outcome
		incident                         bool
	}
	convs := map[string]*conv{}
	ok, scored := 0, 0
	for i, ev := range em.evs {
		if ev.ConversationID == "" || ev.Turn < 1 {
			t.Fatalf("event %d without a conversation: %+v", i, ev)
		}
		c := convs[ev.ConversationID]
		if c == nil {
			c = &conv{}
			convs[ev.ConversationID] = c
		}
		if c.outcomes > 0 {
			t.Fatalf("conversation %s has turn %d after its outcome", ev.ConversationID, ev.Turn)
		}
		c.turns++
		if ev.Turn != c.turns {
			t.Fatalf("conversation %s: turn %d, want %d", ev.ConversationID, ev.Turn, c.turns)
		}
		if ev.Outcome != "" {
			c.outcomes++
			c.outcome = ev.Outcome
			c.incident = recs[i].At >= in.Start && recs[i].At < in.Start+in.Duration
		}
		if ev.Status == events.StatusOK {
			ok++
		}
		for _, s := range ev.Scores {
			if s.Name != "quality" || s.Value < 0 || s.Value > 1 || ev.Status != events.StatusOK {
				t.Fatalf("score %+v on %+v", s, ev)
			}
			scored++
		}
	}
	var ended, turns int
	var done, n [2]float64 // [normal, incident]
	for id, c := range convs {
		if c.outcomes == 0 {
			continue
		}
		ended++
		turns += c.turns
		k := 0
		if c.incident {
			k = 1
		}
		n[k]++
		if c.outcome == events.OutcomeCompleted {
			done[k]++
		}
		if c.outcome != events.OutcomeCompleted && c.outcome != events.OutcomeAbandoned {
			t.Fatalf("conversation %s: outcome %q", id, c.outcome)
		}
	}
	if ended < len(convs)*8/10 {
		t.Fatalf("%d of %d conversations ended", ended, len(convs))
	}
	t.Logf("%d conversations, %d ended, completed %.2f of %v normal, %.2f of %v in the incident", len(convs), ended, done[0]/n[0], n[0], done[1]/n[1], n[1])
	if mean := float64(turns) / float64(ended); mean < 3 || mean > 4.5 {
		t.Fatalf("%.2f turns per ended conversation, want about 4 (a few end early)", mean)
	}
	if n[1] < 100 || done[0]/n[0] < 0.7 || done[1]/n[1] > 0.5 {
		t.Fatalf("completed: %.2f of %v normal conversations, %.2f of %v in the incident", done[0]/n[0], n[0], done[1]/n[1], n[1])
	}
	if share := float64(scored) / float64(ok); share < 0.15 || share > 0.25 {
		t.Fatalf("quality scores on %.2f of the ok answers, want 0.2", share)
	}
	for _, f := range fb.fbs {
		if f.ConversationID == "" || f.RequestID == "" {
			t.Fatalf("verdict %+v: want its request and conversation", f)
		}
	}
}

// TestConversationsThroughAnEndpoint: against an endpoint, each request names its
// conversation and turn in the proxy's headers, and each ended conversation gets the users'
// task_completed (and for a share, thumbs) on the conversation, as an app sends them.
func TestConversationsThroughAnEndpoint(t *testing.T) {
	fake := fakellm.New(fakellm.Options{TTFT: time.Millisecond})
	var mu sync.Mutex
	seen := map[string][]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Tokenscope-Conversation-Id")
		turn, err := strconv.Atoi(r.Header.Get("X-Tokenscope-Turn"))
		if id == "" || err != nil {
			t.Errorf("request without conversation headers: %v", r.Header)
		}
		mu.Lock()
		seen[id] = append(seen[id], turn)
		mu.Unlock()
		fake.ServeHTTP(w, r)
	}))
	defer srv.Close()
	recs := Generate(Conversation, 3*time.Minute, 3)[:600]
	for i := range recs {
		recs[i].Input, recs[i].Output = min(recs[i].Input, 50), min(recs[i].Output, 5)
	}
	var em memEmitter
	var fb memFeedback
	var st Stats
	client := &llmclient.Client{BaseURL: srv.URL, Protocol: meter.OpenAIChat, HTTP: srv.Client()}
	Run(context.Background(), recs, Options{Speed: 50, Model: "m", Scene: "chat", Env: "test",
		Target: &Target{Client: client, Stream: true, Concurrency: 64}, Users: NewUsers(0.5, &fb, 3),
		Conversations: NewConversations(3, 3)}, &em, &st)
	if st.Sent.Load() != int64(len(recs)) || st.OK.Load()+st.Skipped.Load() < int64(len(recs))-5 {
		t.Fatalf("sent %d ok %d skipped %d", st.Sent.Load(), st.OK.Load(), st.Skipped.Load())
	}
	if client.Header != nil {
		t.Fatalf("the shared client's headers changed: %v", client.Header)
	}
	ended := map[string]bool{}
	for _, ev := range em.evs {
		if ev.Outcome != "" {
			ended[ev.ConversationID] = true
		}
	}
	tasks, thumbs := map[string]bool{}, 0
	for _, f := range fb.fbs {
		if f.RequestID != "" || !ended[f.ConversationID] || f.Scene != "chat" {
			t.Fatalf("verdict %+v is not on an ended conversation", f)
		}
		switch f.Name {
		case "task_completed":
			tasks[f.ConversationID] = true
		case "thumbs":
			thumbs++
		}
	}
	if len(ended) < 40 || len(tasks) != len(ended) || thumbs < len(ended)/4 || thumbs > len(ended)*3/4 {
		t.Fatalf("%d conversations ended, %d with task_completed, %d thumbs", len(ended), len(tasks), thumbs)
	}
	if len(seen) < 100 {
		t.Fatalf("requests in %d conversations", len(seen))
	}
}

func TestConversationsPlan(t *testing.T) {
	cs := NewConversations(1, 1)
	for range 100 {
		if n := cs.plan(); n != 1 {
			t.Fatalf("mean 1: planned %d turns", n)
		}
	}
	cs = NewConversations(6, 1)
	sum := 0
	for range 10_000 {
		n := cs.plan()
		if n < 1 || n > maxTurns {
			t.Fatalf("planned %d turns", n)
		}
		sum += n
	}
	if mean := float64(sum) / 10_000; mean < 5.5 || mean > 6.5 {
		t.Fatalf("mean %.2f turns, want 6", mean)
	}
}
