package ingest

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

type memPub struct {
	msgs  []string
	data  [][]byte
	full  bool
	limit int // messages it takes before it is full; 0 for no limit
}

func (p *memPub) Publish(subject, id string, data []byte) bool {
	if p.full || (p.limit > 0 && len(p.msgs) >= p.limit) {
		return false
	}
	p.msgs = append(p.msgs, subject+" "+id)
	p.data = append(p.data, data)
	return true
}

func newHandler(pub Publisher) *Handler {
	return New(Options{MaxBytes: 1 << 20}, pub, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

func post(h http.Handler, body string) (int, Answer) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body)))
	var a Answer
	_ = json.Unmarshal(rec.Body.Bytes(), &a)
	return rec.Code, a
}

// TestIngestPayload checks what is published is the canonical encoding, whatever form the
// client sent, never a form only this client uses.
func TestIngestPayload(t *testing.T) {
	canonical := event("a")
	tests := []struct{ name, body string }{
		{"canonical", canonical},
		{"spaced", strings.ReplaceAll(canonical, `":`, `": `)},
		{"unknown field", strings.Replace(canonical, `"model"`, `"extra":{"x":[1,2]},"model"`, 1)},
		{"offset timestamp", strings.Replace(canonical, `2026-03-01T11:59:00.000Z`, `2026-03-01T13:59:00.000+02:00`, 1)},
		{"float spelling", strings.Replace(canonical, `"ttft_ms":100`, `"ttft_ms":1.0e2`, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, body := range []string{tt.body, tt.body + "\n" + tt.body, "[" + tt.body + "]"} {
				pub := &memPub{}
				if code, a := post(newHandler(pub), body); code != 202 || a.Accepted == 0 {
					t.Fatalf("%d %+v", code, a)
				}
				for _, data := range pub.data {
					if string(data) != canonical {
						t.Fatalf("published %s, want %s", data, canonical)
					}
				}
			}
		})
	}
	// Many non-canonical events fill more than one arena block, each payload intact.
	var sb strings.Builder
	n := 2*arenaChunk/len(canonical) + 10
	for i := range n {
		fmt.Fprintf(&sb, "%s\n", strings.ReplaceAll(event(fmt.Sprint("id-", i)), `":`, `": `))
	}
	pub := &memPub{}
	if code, a := post(newHandler(pub), sb.String()); code != 202 || a.Accepted != n {
		t.Fatalf("%d %+v", code, a)
	}
	for i, data := range pub.data {
		if want := event(fmt.Sprint("id-", i)); string(data) != want {
			t.Fatalf("payload %d is %s, want %s", i, data, want)
		}
	}
}

// TestIngestBufferFills: the events the publisher has no room for are rejected one by one
// with their index, the others accepted; with none taken the answer is 503.
func TestIngestBufferFills(t *testing.T) {
	body := event("a") + "\n" + event("b") + "\n{oops\n" + event("c") + "\n" + event("d") + "\n"
	pub := &memPub{limit: 2}
	code, a := post(newHandler(pub), body)
	if code != 202 || a.Accepted != 2 || a.Rejected != 3 || len(a.Errors) != 3 {
		t.Fatalf("%d %+v", code, a)
	}
	if a.Errors[1].Index != 3 || !strings.Contains(a.Errors[1].Error, "publish buffer full") || a.Errors[2].Index != 4 {
		t.Fatalf("errors %+v", a.Errors)
	}
	rec := httptest.NewRecorder()
	newHandler(pub).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body)))
	_ = json.Unmarshal(rec.Body.Bytes(), &a)
	if rec.Code != 503 || a.Accepted != 0 || a.Rejected != 5 {
		t.Fatalf("%d %+v", rec.Code, a)
	}
	// Sent again after a second, as every other 503 of the emitter says.
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q", got)
	}
}

func event(id string) string {
	return fmt.Sprintf(`{"v":1,"event_id":%q,"ts":"2026-03-01T11:59:00.000Z","model":"m","scene":"chat","env":"prod","input_tokens":10,"output_tokens":5,"ttft_ms":100,"total_ms":300,"status":"ok"}`, id)
}

func TestIngest(t *testing.T) {
	deep := `{"x":` + strings.Repeat("[", 10_001) + strings.Repeat("]", 10_001) + `}`
	bad := `{"v":1,"event_id":"bad","ts":"2026-03-01T11:59:00.000Z","model":"m","scene":"chat","env":"prod","input_tokens":10,"output_tokens":5,"ttft_ms":500,"total_ms":300,"status":"ok"}`
	tests := []struct {
		name      string
		body      string
		token     string
		full      bool
		status    int
		accepted  int
		rejected  int
		errSubstr string
	}{
		{"one event", event("a"), "", false, 202, 1, 0, ""},
		{"pretty-printed event", "{\n  \"v\": 1,\n" + event("a")[7:], "", false, 202, 1, 0, ""},
		{"array", "[" + event("a") + "," + bad + "," + event("b") + "]", "", false, 202, 2, 1, "ttft_ms is above total_ms"},
		{"ndjson", event("a") + "\n\n" + event("b") + "\n" + bad + "\n{oops\n", "", false, 202, 2, 2, "malformed"},
		// Valid JSON, nested deeper than encoding/json reads: refused alone, as on a line.
		{"array, an item nested past 10,000", "[" + event("a") + "," + deep + "," + event("b") + "]", "", false, 202, 2, 1, "nested too deeply"},
		{"array, brackets in strings", "[" + strings.Replace(event("a"), `{"v":1`, `{"note":"]},\\\"[{","v":1`, 1) + "," + event("b") + "]", "", false, 202, 2, 0, ""},
		{"ndjson, a line nested past 10,000", event("a") + "\n" + deep + "\n" + event("b"), "", false, 202, 2, 1, "nested too deeply"},
		{"none valid", bad, "", false, 400, 0, 1, "ttft_ms"},
		// A direct publisher is told, not silently cut: it can fix what it sends.
		{"label too long", strings.Replace(event("a"), `"scene":"chat"`, `"scene":"`+strings.Repeat("s", 1024)+`"`, 1), "", false, 400, 0, 1, "scene: too long"},
		{"not an array", "[1,", "", false, 400, 0, 0, "not a JSON array"},
		{"empty", "  ", "", false, 400, 0, 0, "no events"},
		{"buffer full", event("a"), "", true, 503, 0, 1, "publish buffer full"},
		{"token missing", event("a"), "s3cret", false, 401, 0, 0, "bearer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := &memPub{full: tt.full}
			h := New(Options{MaxBytes: 1 << 20, Token: tt.token}, pub, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(tt.body)))
			var a Answer
			if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
				t.Fatalf("answer %q: %v", rec.Body, err)
			}
			if rec.Code != tt.status || a.Accepted != tt.accepted || a.Rejected != tt.rejected {
				t.Fatalf("got %d accepted %d rejected %d, want %d %d %d: %s", rec.Code, a.Accepted, a.Rejected, tt.status, tt.accepted, tt.rejected, rec.Body)
			}
			if tt.errSubstr != "" && !strings.Contains(rec.Body.String(), tt.errSubstr) {
				t.Fatalf("answer %s does not say %q", rec.Body, tt.errSubstr)
			}
			if len(pub.msgs) != tt.accepted {
				t.Fatalf("published %d, accepted %d", len(pub.msgs), tt.accepted)
			}
			if tt.accepted > 0 && pub.msgs[0] != "llm.req.prod.chat a" {
				t.Fatalf("published %q", pub.msgs[0])
			}
		})
	}
}

// TestIngestBurstBoundsSubjects: 100,000 made-up scenes through the ingest publish on at
// most EMITTER_MAX_SUBJECTS subjects, each event keeping its exact scene in the payload, and
// once they stop, a real new scene gets its own subject again.
func TestIngestBurstBoundsSubjects(t *testing.T) {
	const limit = 500
	clock := now
	pub := &memPub{}
	h := New(Options{MaxBytes: 16 << 20, Subjects: subject.New(limit, time.Hour, nil)}, pub, func() time.Time { return clock }, nil,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	for b := range 10 {
		var sb strings.Builder
		for i := range 10_000 {
			n := b*10_000 + i
			fmt.Fprintf(&sb, "%s\n", strings.Replace(event(fmt.Sprint("id-", n)), `"scene":"chat"`, fmt.Sprintf(`"scene":"burst-%d"`, n), 1))
		}
		if code, a := post(h, sb.String()); code != 202 || a.Accepted != 10_000 {
			t.Fatalf("batch %d: %d %+v", b, code, a)
		}
		clock = clock.Add(time.Second)
	}
	subjects := map[string]bool{}
	for i, m := range pub.msgs {
		subjects[strings.Fields(m)[0]] = true
		var ev events.RequestEvent
		if err := events.UnmarshalRequest(pub.data[i], &ev); err != nil || ev.Scene != fmt.Sprint("burst-", i) {
			t.Fatalf("event %d: scene %q, %v", i, ev.Scene, err)
		}
	}
	if len(subjects) != limit+1 || !subjects["llm.req.prod.other"] {
		t.Fatalf("%d subjects for 100,000 scenes, want %d and llm.req.prod.other", len(subjects), limit)
	}
	clock = clock.Add(time.Hour)
	pub.msgs = pub.msgs[:0]
	if code, _ := post(h, strings.Replace(event("real"), `"scene":"chat"`, `"scene":"checkout"`, 1)); code != 202 || pub.msgs[0] != "llm.req.prod.checkout real" {
		t.Fatalf("a real scene after the burst: %d %v", code, pub.msgs)
	}
}

func TestIngestLimitsAndToken(t *testing.T) {
	pub := &memPub{}
	h := New(Options{MaxBytes: 2048, Token: "s3cret"}, pub, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	post := func(body io.Reader, length int64, auth string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/events", body)
		req.ContentLength = length
		req.Header.Set("Authorization", auth)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	big := strings.Repeat(event("x")+"\n", 20)
	if got := post(strings.NewReader(big), int64(len(big)), "Bearer s3cret"); got != 413 {
		t.Fatalf("declared oversize: %d", got)
	}
	if got := post(strings.NewReader(big), -1, "Bearer s3cret"); got != 413 {
		t.Fatalf("chunked oversize: %d", got)
	}
	if got := post(strings.NewReader(event("a")), -1, "Bearer wrong"); got != 401 {
		t.Fatalf("wrong token: %d", got)
	}
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "Bearer   s3cret"} {
		if got := post(strings.NewReader(event("a")), -1, auth); got != 202 {
			t.Fatalf("right token as %q: %d", auth, got)
		}
	}
	for _, auth := range []string{"", "s3cret", "Bearer", "Bearer ", "Basic s3cret", "Bearers3cret", "Bearer s3cretx"} {
		if got := post(strings.NewReader(event("a")), -1, auth); got != 401 {
			t.Fatalf("authorization %q: %d, want 401", auth, got)
		}
	}
}

// TestIngestDeclaredLengthNotAllocated opens connections that each declare a body of the
// largest size and send one byte of it: the buffers held grow with what has arrived, not
// with what was declared, so idle clients cannot make the emitter hold MaxBytes each. Bodies
// longer than the first chunk, or shorter than declared, are still read right.
func TestIngestDeclaredLengthNotAllocated(t *testing.T) {
	const maxBytes, conns = 16 << 20, 16
	h := New(Options{MaxBytes: maxBytes}, &memPub{}, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var entered sync.WaitGroup
	entered.Add(conns)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Idle") != "" {
			entered.Done()
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range conns {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/events HTTP/1.1\r\nHost: x\r\nX-Idle: 1\r\nContent-Length: %d\r\n\r\n{", maxBytes)
	}
	entered.Wait()
	time.Sleep(200 * time.Millisecond) // the handlers are reading the bodies, waiting for the rest
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > conns<<20 {
		t.Fatalf("%d connections that sent 1 byte each hold %d MiB", conns, grew>>20)
	}

	// A body of many chunks arrives whole; one shorter than declared is a read error.
	var sb strings.Builder
	for i := 0; sb.Len() < 160<<10; i++ { // more than two of the chunks a buffer starts in
		sb.WriteString(event(fmt.Sprint("e", i)) + "\n")
	}
	resp, err := http.Post(srv.URL, "application/x-ndjson", strings.NewReader(sb.String()))
	if err != nil {
		t.Fatal(err)
	}
	var a Answer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	resp.Body.Close()
	if want := strings.Count(sb.String(), "\n"); resp.StatusCode != 202 || a.Accepted != want || a.Rejected != 0 {
		t.Fatalf("a body of %d bytes: %d %d accepted (want %d), %d rejected", sb.Len(), resp.StatusCode, a.Accepted, want, a.Rejected)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(event("a")))
	req.ContentLength = int64(len(event("a")) + 10)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "cannot read the body") {
		t.Fatalf("a body shorter than declared: %d %s", rec.Code, rec.Body)
	}
}

// TestIngestCompressedBody: a compressed body is refused as such (415, naming the encoding),
// not read as events that are all malformed; identity is the body as it is.
func TestIngestCompressedBody(t *testing.T) {
	for _, tc := range []struct {
		enc    string
		status int
	}{{"gzip", 415}, {" GZIP ", 415}, {"br", 415}, {"gzip, identity", 415}, {"identity", 202}, {"", 202}} {
		pub := &memPub{}
		body := []byte(event("a"))
		if tc.status == 415 { // what a client compressing its bodies sends
			var zb bytes.Buffer
			zw := gzip.NewWriter(&zb)
			_, _ = zw.Write(body)
			_ = zw.Close()
			body = zb.Bytes()
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/events", bytes.NewReader(body))
		if tc.enc != "" {
			req.Header.Set("Content-Encoding", tc.enc)
		}
		rec := httptest.NewRecorder()
		newHandler(pub).ServeHTTP(rec, req)
		var a Answer
		_ = json.Unmarshal(rec.Body.Bytes(), &a)
		if rec.Code != tc.status {
			t.Fatalf("Content-Encoding %q: %d %+v, want %d", tc.enc, rec.Code, a, tc.status)
		}
		if tc.status == 415 && (!strings.Contains(a.Error, "content encoding") || len(pub.msgs) != 0) {
			t.Fatalf("Content-Encoding %q: %+v, %d published", tc.enc, a, len(pub.msgs))
		}
	}
}

// TestIngestEventIDHeaderSafe: an event_id a Nats-Msg-Id header cannot carry as it is (a
// control character, a space at either end) is refused, naming event_id, and would
// otherwise be published under the id of another event; the events beside it are published.
func TestIngestEventIDHeaderSafe(t *testing.T) {
	pub := &memPub{}
	body := event("a") + "\n" + event(" a") + "\n" + strings.Replace(event("x"), `"x"`, `"b\r\nc"`, 1) + "\n" + event("order 17")
	code, a := post(newHandler(pub), body)
	if code != 202 || a.Accepted != 2 || a.Rejected != 2 {
		t.Fatalf("%d %+v, want 2 accepted and 2 rejected", code, a)
	}
	for i, e := range a.Errors {
		if e.Index != i+1 || !strings.Contains(e.Error, "event_id") {
			t.Fatalf("error %d: %+v, want index %d naming event_id", i, e, i+1)
		}
	}
	if len(pub.msgs) != 2 || pub.msgs[0] != "llm.req.prod.chat a" || pub.msgs[1] != "llm.req.prod.chat order 17" {
		t.Fatalf("published %q", pub.msgs)
	}
}

func BenchmarkIngestNDJSON(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString(event(events.NewEventID()[:30] + fmt.Sprint(i)))
		sb.WriteByte('\n')
	}
	body := sb.String()
	h := New(Options{MaxBytes: 16 << 20}, discard{}, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body)))
		if rec.Code != 202 {
			b.Fatal(rec.Body)
		}
	}
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkIngestNDJSONScenes is BenchmarkIngestNDJSON with the subject limit the server
// uses and a scene that changes from each event to the next, so every event asks the limit.
func BenchmarkIngestNDJSONScenes(b *testing.B) {
	var sb strings.Builder
	for i := range 1000 {
		sb.WriteString(strings.Replace(event(events.NewEventID()[:30]+fmt.Sprint(i)), `"scene":"chat"`, fmt.Sprintf(`"scene":"chat-%d"`, i%8), 1))
		sb.WriteByte('\n')
	}
	body := sb.String()
	h := New(Options{MaxBytes: 16 << 20, Subjects: subject.New(1000, time.Hour, nil)}, discard{}, func() time.Time { return now }, nil,
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body)))
		if rec.Code != 202 {
			b.Fatal(rec.Body)
		}
	}
	b.ReportMetric(float64(b.N)*1000/b.Elapsed().Seconds(), "events/s")
}

type discard struct{}

func (discard) Publish(string, string, []byte) bool { return true }

// TestIngestScores: a request event's inline scores are published in the canonical form (a
// boolean as 1 or 0), and one with a bad score is rejected with its reason beside it.
func TestIngestScores(t *testing.T) {
	withScores := func(id, scores string) string {
		e := event(id)
		return e[:len(e)-1] + `,"scores":` + scores + "}"
	}
	body := withScores("a", `{ "quality": 0.80, "task_completed": true }`) + "\n" + withScores("b", `{"not a name":1}`)
	pub := &memPub{}
	code, a := post(newHandler(pub), body)
	if code != 202 || a.Accepted != 1 || a.Rejected != 1 || len(a.Errors) != 1 || a.Errors[0].Index != 1 ||
		!strings.Contains(a.Errors[0].Error, "scores") {
		t.Fatalf("%d %+v", code, a)
	}
	if want := withScores("a", `{"quality":0.8,"task_completed":1}`); len(pub.data) != 1 || string(pub.data[0]) != want {
		t.Fatalf("published %q, want %s", pub.data, want)
	}
}

// heldPub keeps what it is handed as it was handed, as the publisher's buffer does while
// NATS is away.
type heldPub struct {
	ids  []string
	data [][]byte
}

func (p *heldPub) Publish(_, id string, data []byte) bool {
	p.ids, p.data = append(p.ids, id), append(p.data, data)
	return true
}

// TestIngestHoldsNoBody: what is published while NATS is away holds the events, not the
// bodies they came in. A body of one small event and megabytes beside it (padding, or
// events that were rejected) is freed once its answer is sent, whatever the event's form.
func TestIngestHoldsNoBody(t *testing.T) {
	const bodies, pad = 8, 4 << 20
	h := New(Options{MaxBytes: 16 << 20}, &heldPub{}, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pub := h.pub.(*heldPub)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range bodies {
		ev := event(fmt.Sprintf("held-%d", i))
		body := ev + strings.Repeat(" ", pad) // one event and trailing spaces
		if i%2 == 1 {
			body = ev + "\n" + strings.Repeat("x", pad) // a canonical event and a bad line
		}
		if code, a := post(h, body); code != http.StatusAccepted || a.Accepted != 1 {
			t.Fatalf("body %d: %d %+v", i, code, a)
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > pad {
		t.Fatalf("the heap holds %d bytes more for %d published events: the bodies they came in are still held", grown, len(pub.ids))
	}
	for i, id := range pub.ids {
		if want := fmt.Sprintf("held-%d", i); id != want || !strings.Contains(string(pub.data[i]), want) {
			t.Fatalf("message %d: id %q, data %s", i, id, pub.data[i])
		}
	}
}

// heapPub records the live heap when it is handed an event.
type heapPub struct{ live []uint64 }

func (p *heapPub) Publish(string, string, []byte) bool {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	p.live = append(p.live, m.HeapAlloc)
	return true
}

// TestIngestArrayHoldsItsBodyOnly: a JSON array of millions of tiny items (a 4 MiB body of
// "{}" or numbers) is read one item at a time, never as a slice of every item beside the
// body, which made such a body hold ten times its size and more. The items are rejected,
// the good events beside them published, and a malformed array still publishes none.
func TestIngestArrayHoldsItsBodyOnly(t *testing.T) {
	const size = 4 << 20
	h := New(Options{MaxBytes: 16 << 20}, &heapPub{}, func() time.Time { return now }, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	pub := h.pub.(*heapPub)
	for _, item := range []string{"{}", "1"} {
		n := size / (len(item) + 1)
		body := "[" + event("first") + "," + strings.Repeat(item+",", n) + event("last") + "]"
		pub.live = pub.live[:0]
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		code, a := post(h, body)
		if code != http.StatusAccepted || a.Accepted != 2 || a.Rejected != n || len(a.Errors) != MaxReportedErrors || a.Errors[0].Index != 1 {
			t.Fatalf("items %s: %d accepted %d rejected %d (want %d), first error %+v", item, code, a.Accepted, a.Rejected, n, a.Errors[0])
		}
		if grown := int64(pub.live[1]) - int64(before.HeapAlloc); grown > 3*int64(len(body)) {
			t.Fatalf("items %s: a body of %d MiB holds %d MiB as its last event is published", item, len(body)>>20, grown>>20)
		}
	}
	// More envs than the decoder interns: each event's subject is its own env's.
	var items []string
	for i := range 100 {
		items = append(items, strings.Replace(event(fmt.Sprint("env-", i)), `"env":"prod"`, fmt.Sprintf(`"env":"e%03d"`, i), 1))
	}
	mp := &memPub{}
	if code, a := post(newHandler(mp), "[\n"+strings.Join(items, " ,\n")+"\n]"); code != http.StatusAccepted || a.Accepted != 100 {
		t.Fatalf("100 envs: %d %+v", code, a)
	}
	for i, m := range mp.msgs {
		if want := fmt.Sprintf("llm.req.e%03d.chat env-%d", i, i); m != want {
			t.Fatalf("message %d: %s, want %s", i, m, want)
		}
	}
	for _, body := range []string{"[" + event("a") + ",{}", "[" + event("a") + "] x", "[" + event("a") + ",]"} {
		code, a := post(h, body)
		if code != http.StatusBadRequest || a.Accepted != 0 || !strings.HasPrefix(a.Error, "the body is not a JSON array of events: ") {
			t.Fatalf("%.40q: %d %+v", body, code, a)
		}
	}
}

// TestIngestStalledBody: a client that stops sending its body, or a chunked body that never
// ends, is answered 408 once nothing has arrived for the idle timeout, and gives its memory
// back to the budget; before, its handler waited for ever, holding both. A body that keeps
// arriving, however slowly, is read whole.
func TestIngestStalledBody(t *testing.T) {
	const idle = 300 * time.Millisecond
	budget := reqbody.NewBudget(64<<20, nil)
	h := New(Options{MaxBytes: 1 << 20, Budget: budget, BodyIdle: idle}, &memPub{}, func() time.Time { return now }, nil, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(h)
	defer srv.Close()
	ev := event("slow")
	for _, tc := range []struct {
		name   string
		head   string
		pieces []string
		want   int
	}{
		{"stops sending", fmt.Sprintf("Content-Length: %d\r\n", len(ev)), []string{ev[:10]}, http.StatusRequestTimeout},
		{"chunked, never ends", "Transfer-Encoding: chunked\r\n", []string{fmt.Sprintf("%x\r\n%s\r\n", len(ev), ev)}, http.StatusRequestTimeout},
		{"slow but steady", fmt.Sprintf("Content-Length: %d\r\n", len(ev)), []string{ev[:10], ev[10:40], ev[40:80], ev[80:]}, http.StatusAccepted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/events HTTP/1.1\r\nHost: x\r\n%s\r\n", tc.head)
			for _, p := range tc.pieces {
				time.Sleep(idle / 3)
				if _, err := io.WriteString(c, p); err != nil {
					t.Fatal(err)
				}
			}
			_ = c.SetReadDeadline(time.Now().Add(idle + 5*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v (held %d)", err, budget.Held())
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			for i := 0; budget.Held() != 0 && i < 100; i++ {
				time.Sleep(10 * time.Millisecond)
			}
			if budget.Held() != 0 {
				t.Fatalf("%d bytes of the budget still held", budget.Held())
			}
		})
	}
}
