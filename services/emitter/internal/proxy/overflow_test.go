package proxy

import (
	"bytes"
	"crypto/sha256"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// TestOverflowStreamsThrough: an upstream sends an event far longer than the meter's limit.
// The client gets every byte (less the usage chunk the proxy asked for), without waiting for
// the event to end; the proxy's memory does not grow with the event; the event says
// meter_overflow, and the usage that came after it is read. Through the relay loop and
// through the goroutine relay (http.Transport), stripping the usage chunk and not.
func TestOverflowStreamsThrough(t *testing.T) {
	bothClients(t, func(t *testing.T, transport bool) {
		for _, strip := range []bool{true, false} {
			name := "client asked for usage"
			if strip {
				name = "usage chunk stripped"
			}
			t.Run(name, func(t *testing.T) { testOverflowStreamsThrough(t, transport, strip) })
		}
	})
}

func testOverflowStreamsThrough(t *testing.T, transport, strip bool) {
	const (
		limit = 64 << 10
		huge  = 32 << 20     // the long event's content: 512 times the limit
		first = huge - 1<<20 // sent before the upstream waits for the client to have it
	)
	chunk := sseEvent("hi")
	usage := "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":22}}\n\n"
	head := `data: {"id":"x","choices":[{"index":0,"delta":{"content":"`
	tail := "\"}}]}\n\n" + chunk + usage + "data: [DONE]\n\n"
	piece := bytes.Repeat([]byte("a"), 32<<10)

	// The client says when it has the first part of the long event: until then the upstream
	// sends no more, so a proxy that held the event back would leave the client with nothing.
	// Meanwhile the client looks at the live heap: a meter that kept the event holds 31 MiB.
	gotFirst := make(chan struct{})
	var heldBack atomic.Bool
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, chunk+head)
		for sent := 0; sent < huge; sent += len(piece) {
			if sent == first {
				_ = rc.Flush()
				select {
				case <-gotFirst:
				case <-time.After(20 * time.Second):
					heldBack.Store(true)
				case <-r.Context().Done():
					return
				}
			}
			if _, err := w.Write(piece); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, tail)
	}))
	t.Cleanup(up.Close)
	p, cap, _ := newTestProxy(t, up.URL+"/v1", func(c *Config) { c.MaxEventBytes = limit })
	srv := serveProxy(t, p, nil, nil)
	rig := &rig{p: p}
	if transport {
		rig.viaTransport()
	}

	body := chatBody(true, "")
	if !strip {
		body = chatBody(true, `,"stream_options":{"include_usage":true}`)
	}
	want := sha256.New()
	_, _ = io.WriteString(want, chunk+head)
	for range huge / len(piece) {
		want.Write(piece)
	}
	rest := tail
	if strip {
		rest = strings.Replace(tail, usage, "", 1)
	}
	_, _ = io.WriteString(want, rest)

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := http.Post(srv.URL+chatPath, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	got := &firstBytes{h: sha256.New(), n: len(chunk) + len(head) + first, reached: gotFirst}
	n, err := io.CopyBuffer(got, resp.Body, make([]byte, 32<<10))
	resp.Body.Close()
	if heldBack.Load() || err != nil {
		t.Fatalf("the client got %d bytes (%v) while the upstream waited for it to have the first %d of the long event", n, err, first)
	}
	ev := cap.next(t)
	if !bytes.Equal(got.h.Sum(nil), want.Sum(nil)) {
		t.Fatalf("the client got %d bytes, not the upstream's", n)
	}
	// The proxy, the fake upstream and the client together, in the middle of the event.
	if grew := int64(got.live) - int64(before.HeapAlloc); grew > huge/4 {
		t.Fatalf("the live heap grew by %d MiB in the middle of a %d MiB event", grew>>20, huge>>20)
	}
	if ev.Status != events.StatusError || ev.ErrorCode != meter.CodeOverflow || ev.OutputTokens != 22 || ev.InputTokens != 11 || ev.TokensEstimated {
		t.Fatalf("event %s %q, tokens %d/%d estimated %v", ev.Status, ev.ErrorCode, ev.InputTokens, ev.OutputTokens, ev.TokensEstimated)
	}
	if got := testutil.ToFloat64(p.m.overflows); got != 1 {
		t.Fatalf("meter_overflows_total = %v", got)
	}
	if onLoop := loopStreams(p); !transport && onLoop == 0 {
		t.Fatal("the stream did not go through the relay loop")
	}
}

// firstBytes hashes what it is given; once it has had n bytes, it notes the live heap and
// closes reached.
type firstBytes struct {
	h       hash.Hash
	n       int
	seen    int
	live    uint64
	reached chan struct{}
}

func (f *firstBytes) Write(p []byte) (int, error) {
	f.h.Write(p)
	if f.seen < f.n && f.seen+len(p) >= f.n {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		f.live = ms.HeapAlloc
		close(f.reached)
	}
	f.seen += len(p)
	return len(p), nil
}

func sseEvent(content string) string {
	return `data: {"id":"x","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"content":"` + content + `"}}]}` + "\n\n"
}

// TestResponsesOverflowRead: a Responses stream's response.completed repeats the whole
// output, so a long answer's is past the limit, and so is a long image event before it: the
// client gets every byte, and the request's event is ok with the usage the terminal event
// carries, not one in the output's text; meter_overflows_total counts the response.
func TestResponsesOverflowRead(t *testing.T) {
	const (
		limit = 64 << 10
		huge  = 8 << 20 // each long event's content: 128 times the limit
	)
	long := strings.Repeat("a", huge)
	stream := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.image_generation_call.partial_image\ndata: {\"type\":\"response.image_generation_call.partial_image\",\"partial_image_b64\":\"" + long + "\"}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"" + long + "\\\"usage\\\":{\\\"input_tokens\\\":1}\"}]}],\"usage\":{\"input_tokens\":11,\"output_tokens\":22},\"metadata\":{}},\"sequence_number\":4}\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for s := stream; len(s) > 0; {
			n := min(len(s), 32<<10)
			if _, err := io.WriteString(w, s[:n]); err != nil {
				return
			}
			s = s[n:]
		}
	}))
	t.Cleanup(up.Close)
	p, cap, _ := newTestProxy(t, up.URL+"/v1", func(c *Config) { c.MaxEventBytes = limit })
	srv := serveProxy(t, p, nil, nil)
	resp, err := http.Post(srv.URL+responsesPath, "application/json", strings.NewReader(`{"model":"gpt-5","stream":true,"input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(got) != stream {
		t.Fatalf("the client got %d bytes (%v), not the upstream's %d", len(got), err, len(stream))
	}
	ev := cap.next(t)
	if ev.Status != events.StatusOK || ev.InputTokens != 11 || ev.OutputTokens != 22 || ev.TokensEstimated {
		t.Fatalf("event %s %q, tokens %d/%d estimated %v", ev.Status, ev.ErrorCode, ev.InputTokens, ev.OutputTokens, ev.TokensEstimated)
	}
	if got := testutil.ToFloat64(p.m.overflows); got != 1 {
		t.Fatalf("meter_overflows_total = %v", got)
	}
}
