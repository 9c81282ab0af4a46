package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestProxyKeepsEventsWithHostileLabels: a 1 KB scene header and a 300-byte model name
// with CR and NUL in it still give the request its event, with the labels fitted, and
// /metrics shows no raw control byte.
func TestProxyKeepsEventsWithHostileLabels(t *testing.T) {
	base, js, stop := serveRig(t)
	defer stop()
	model := "gpt-\r\n" + strings.Repeat("m", 300) + "\x00"
	scene := strings.Repeat("s", 1024)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-\r\n`+strings.Repeat("m", 300)+`\u0000","max_tokens":4,"messages":[{"role":"user","content":"a b c"}]}`))
	req.Header.Set(proxyScene, scene)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("proxied answer %d", resp.StatusCode)
	}
	waitMsgs(t, js, 1)
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	var ev events.RequestEvent
	if err := events.UnmarshalRequest(raw.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Scene != events.FitLabel(scene, events.MaxLabelLen) || ev.Model != events.FitLabel(model, events.MaxLabelLen) ||
		raw.Subject != "llm.req.test."+strings.Repeat("s", events.MaxTokenLen) {
		t.Fatalf("stored on %s: scene %q model %q", raw.Subject, ev.Scene, ev.Model)
	}
	mresp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if strings.ContainsAny(string(mb), "\r\x00") || !strings.Contains(string(mb), `model="gpt-__mmm`) {
		t.Fatalf("/metrics has raw control bytes or lacks the model:\n%q", mb)
	}
	for _, want := range []string{`emitter_labels_fitted_total{field="scene",reason="too_long"} 1`, `emitter_labels_fitted_total{field="model",reason="too_long"} 1`,
		`emitter_events_invalid_total{reason="too_long"} 0`} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestIngestBurstBoundsStreamSubjects: 100,000 made-up scenes through the ingest leave the
// stream with EMITTER_MAX_SUBJECTS subjects and llm.req.<env>.other, every event stored.
func TestIngestBurstBoundsStreamSubjects(t *testing.T) {
	base, js, stop := serveRig(t, "EMITTER_MAX_SUBJECTS=1000")
	defer stop()
	ts := time.Now().UTC().Format(events.TimeLayout)
	for b := range 10 {
		var nd strings.Builder
		for i := range 10_000 {
			n := b*10_000 + i
			fmt.Fprintf(&nd, `{"v":1,"event_id":"ev-%d","ts":%q,"model":"m-%d","scene":"burst-%d","env":"prod","input_tokens":1,"output_tokens":1,"ttft_ms":1,"total_ms":2,"status":"ok"}`+"\n", n, ts, n, n)
		}
		// A 503 says the batch was not all stored in time (a loaded machine): sent again, as
		// a client does, it is stored once, by event_id.
		for try := 1; ; try++ {
			resp, err := http.Post(base+"/v1/events", "application/x-ndjson", strings.NewReader(nd.String()))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusServiceUnavailable && try < 5 {
				time.Sleep(time.Second)
				continue
			}
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("batch %d, try %d: %d", b, try, resp.StatusCode)
			}
			break
		}
	}
	waitMsgs(t, js, 100_000)
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.NumSubjects != 1001 {
		t.Fatalf("%d subjects in %s after 100,000 scenes, want 1,001", info.State.NumSubjects, events.StreamEvents)
	}
}
