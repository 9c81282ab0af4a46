package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkResponsesImageEvent: a 50 MiB image event of a Responses stream through the
// proxy, metered (/v1/responses, read as it passes past the meter's limit) and relayed
// unmetered (a path the proxy passes through), in CPU time per MiB of the process (the fake
// upstream and the client included, alike for both).
func BenchmarkResponsesImageEvent(b *testing.B) {
	const size = 50 << 20
	stream := "event: response.image_generation_call.partial_image\ndata: {\"type\":\"response.image_generation_call.partial_image\",\"partial_image_index\":0,\"partial_image_b64\":\"" +
		strings.Repeat("iVBORw0KGgoAAAANSUhEUgAA", size/24) + "\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":11,\"output_tokens\":22}}}\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		ct := "text/event-stream"
		if r.URL.Query().Has("octet") {
			ct = "application/octet-stream" // not a stream: the meter keeps the first MaxBody bytes, then reads no more
		}
		w.Header().Set("Content-Type", ct)
		for s := stream; len(s) > 0; {
			n := min(len(s), 256<<10)
			if _, err := io.WriteString(w, s[:n]); err != nil {
				return
			}
			s = s[n:]
		}
	}))
	b.Cleanup(up.Close)
	for _, bc := range []struct {
		name, path string
		limit      int
	}{
		{"read as it passes", responsesPath, 1 << 20},
		{"held whole", responsesPath, 64 << 20},
		{"not a stream", responsesPath + "?octet", 1 << 20},
		{"passed through", "/v1/unmetered", 1 << 20},
	} {
		path := bc.path
		b.Run(bc.name, func(b *testing.B) {
			p, _, _ := newTestProxy(b, up.URL+"/v1", func(c *Config) { c.MaxEventBytes = bc.limit })
			srv := serveProxy(b, p, nil, nil)
			buf := make([]byte, 256<<10)
			var cpu time.Duration
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				before := processCPU()
				resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(`{"model":"gpt-5","stream":true,"input":"hi"}`))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.CopyBuffer(io.Discard, resp.Body, buf)
				resp.Body.Close()
				if err != nil || n != int64(len(stream)) {
					b.Fatalf("got %d bytes (%v), want %d", n, err, len(stream))
				}
				cpu += processCPU() - before
			}
			b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N)/float64(len(stream)>>20), "cpu-ms/MiB")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
