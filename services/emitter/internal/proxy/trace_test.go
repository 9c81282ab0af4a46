package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// TestTraceparent forwards a client's valid traceparent (and its tracestate) as it came and
// puts its trace id in the event; where the client sent none or an invalid one, the proxy
// starts a trace (a new trace id and span id, sampled), drops the tracestate of an invalid
// one, and the event carries the new trace id.
func TestTraceparent(t *testing.T) { bothClients(t, testTraceparent) }

func testTraceparent(t *testing.T, transport bool) {
	seen := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer up.Close()
	u, _ := ParseUpstream(up.URL)
	r := newRig(t, fakellm.Options{}, func(c *Config) { c.Upstream = u })
	if transport {
		r.viaTransport()
	}
	const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	started := map[string]bool{}
	for _, tc := range []struct {
		name, traceparent string
		keep              bool
	}{
		{"valid", valid, true},
		{"later version with more fields", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-comes", true},
		{"none", "", false},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"upper case", strings.ToUpper(valid), false},
		{"version ff", "ff" + valid[2:], false},
		{"version 00 with more", valid + "-x", false},
		{"short", valid[:54], false},
		{"garbage", "hello", false},
	} {
		hdr := map[string]string{"Tracestate": "vendor=1"}
		if tc.traceparent != "" {
			hdr["Traceparent"] = tc.traceparent
		}
		call(t, r.proxy.URL, chatPath, chatBody(false, ""), hdr)
		h := <-seen
		ev := r.cap.next(t)
		got := h.Values("Traceparent")
		if len(got) != 1 {
			t.Fatalf("%s: upstream saw traceparent %q", tc.name, got)
		}
		if tc.keep {
			if got[0] != tc.traceparent || h.Get("Tracestate") != "vendor=1" || ev.TraceID != tc.traceparent[3:35] {
				t.Errorf("%s: upstream saw %q, tracestate %q; event trace id %q", tc.name, got[0], h.Get("Tracestate"), ev.TraceID)
			}
			continue
		}
		id, ok := traceID(got[0])
		if !ok || len(got[0]) != 55 || got[0][:3] != "00-" || got[0][52:] != "-01" || id != ev.TraceID || !events.ValidTraceID(ev.TraceID) {
			t.Errorf("%s: upstream saw %q, event trace id %q; want a new sampled version-00 traceparent of the event's trace", tc.name, got[0], ev.TraceID)
		}
		if h.Get("Tracestate") != "" {
			t.Errorf("%s: the tracestate of a trace the proxy started was forwarded", tc.name)
		}
		if started[id] {
			t.Errorf("%s: trace id %s started twice", tc.name, id)
		}
		started[id] = true
	}
	// Two traceparent headers are not one valid one.
	req, _ := http.NewRequest(http.MethodPost, r.proxy.URL+chatPath, strings.NewReader(chatBody(false, "")))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Add("Traceparent", valid)
	req.Header.Add("Traceparent", valid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h, ev := <-seen, r.cap.next(t); len(h.Values("Traceparent")) != 1 || ev.TraceID == valid[3:35] {
		t.Errorf("two traceparents: upstream saw %q, event trace id %s", h.Values("Traceparent"), ev.TraceID)
	}
}

func BenchmarkTrace(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		h := http.Header{}
		trace(h)
	}
}
