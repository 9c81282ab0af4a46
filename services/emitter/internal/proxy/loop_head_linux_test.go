//go:build linux

package proxy

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestLoopHeadWithFirstBytes: a stream relayed on the loop gives the client the response's head
// at once, whatever came with it from the upstream (a whole event, half of one, held by the
// meter while the proxy strips the usage chunk it asked for, or nothing), and is relayed whole.
func TestLoopHeadWithFirstBytes(t *testing.T) {
	const hold = 400 * time.Millisecond
	for _, tc := range []struct {
		name      string
		withHead  string // sent in the same write as the head
		afterHold string
	}{
		{"a whole event with the head", sseEvent("one"), sseEvent("two") + "data: [DONE]\n\n"},
		{"half an event with the head", `data: {"choices":[{"delta":{"content":"o`, `ne"}}]}` + "\n\n" + sseEvent("two") + "data: [DONE]\n\n"},
		{"nothing with the head", "", sseEvent("one") + sseEvent("two") + "data: [DONE]\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunk := func(s string) string {
				if s == "" {
					return ""
				}
				return fmt.Sprintf("%x\r\n%s\r\n", len(s), s)
			}
			up := rawUpstream(t, func(c *net.TCPConn) {
				_, _ = io.WriteString(c, sseHead+"Transfer-Encoding: chunked\r\n\r\n"+chunk(tc.withHead))
				time.Sleep(hold)
				_, _ = io.WriteString(c, chunk(tc.afterHold)+"0\r\n\r\n")
				_ = c.Close()
			})
			p, cap, _ := newTestProxy(t, up, nil)
			srv := serveProxy(t, p, nil, nil)
			req, err := http.NewRequest(http.MethodPost, srv.URL+chatPath, strings.NewReader(chatBody(true, "")))
			if err != nil {
				t.Fatal(err)
			}
			tr := &http.Transport{DisableCompression: true}
			defer tr.CloseIdleConnections()
			start := time.Now()
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if took := time.Since(start); took > hold/2 {
				t.Fatalf("the head came after %s, with the upstream's head sent at once", took)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.withHead + tc.afterHold; string(body) != want {
				t.Fatalf("body %q, want %q", body, want)
			}
			if ev := cap.next(t); ev.Status != events.StatusOK || ev.OutputTokens != 2 {
				t.Fatalf("event %+v", ev)
			}
			if p.loops.started() != 1 {
				t.Fatal("the stream did not go through the loop")
			}
		})
	}
}
