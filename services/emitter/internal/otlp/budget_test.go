package otlp

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenscope/tokenscope/services/emitter/internal/ingest"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// gatePub is a publisher whose next Publish, once gate is set, waits for gate to close: it
// holds an export in its handler.
type gatePub struct {
	pubRecorder
	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{}
}

func (p *gatePub) hold() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
	return p.gate
}

func (p *gatePub) Publish(subject, id string, data []byte) bool {
	p.mu.Lock()
	g := p.gate
	p.gate = nil
	p.mu.Unlock()
	if g != nil {
		p.entered <- struct{}{}
		<-g
	}
	return p.pubRecorder.Publish(subject, id, data)
}

// TestBudgetSharedWithIngest: the ingest's bodies and the OTLP receivers' requests take one
// budget. An ingest body held as it arrives makes OTLP/HTTP answer 503 and OTLP/gRPC
// Unavailable, both to be sent again; a gRPC export held in its handler makes the ingest
// answer 503. Once the request holding the memory is answered, the others go through.
func TestBudgetSharedWithIngest(t *testing.T) {
	var sb strings.Builder
	for i := 0; sb.Len() < 100<<10; i++ {
		fmt.Fprintf(&sb, `{"v":1,"event_id":"e%d","ts":"2026-11-30T10:00:00.000Z","model":"m","scene":"chat","env":"prod","input_tokens":10,"output_tokens":5,"ttft_ms":100,"total_ms":300,"status":"ok"}`+"\n", i)
	}
	events := sb.String()
	const maxBytes = 32 << 10 // the largest message: a gRPC export takes twice it
	budget := reqbody.NewBudget(int64(len(events)), nil)
	pub := &gatePub{entered: make(chan struct{}, 1)}
	now := func() time.Time { return testStart.Add(time.Minute) }
	logger := slog.New(slog.DiscardHandler)
	r := New(Options{Labels: DefaultLabels(), MaxBytes: maxBytes, Budget: budget}, pub, now, nil, logger)
	srv, err := r.Listen("127.0.0.1:0", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, time.Second) }()
	defer func() { cancel(); <-done }()
	ing := httptest.NewServer(ingest.New(ingest.Options{MaxBytes: 1 << 20, Budget: budget}, pub, now, nil, logger))
	defer ing.Close()
	cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := ptraceotlp.NewGRPCClient(cc)
	cl := &http.Client{Timeout: 5 * time.Second}

	exportHTTP := func(want int) {
		t.Helper()
		resp, err := cl.Post("http://"+srv.HTTPAddr()+"/v1/traces", contentProto, bytes.NewReader(protoOf(t, batchOf(2, nil))))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("OTLP/HTTP: %d %q, want %d", resp.StatusCode, b, want)
		}
		if want == http.StatusServiceUnavailable {
			var st spb.Status
			if err := proto.Unmarshal(b, &st); err != nil || codes.Code(st.Code) != codes.Unavailable ||
				!strings.Contains(st.Message, "holding its limit of request bodies") || resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("OTLP/HTTP 503: Retry-After %q, status %v (%v)", resp.Header.Get("Retry-After"), &st, err)
			}
		}
	}
	exportGRPC := func(want codes.Code) {
		t.Helper()
		_, err := client.Export(context.Background(), batchOf(2, nil))
		if status.Code(err) != want || (want == codes.Unavailable && !strings.Contains(err.Error(), "holding its limit of request bodies")) {
			t.Fatalf("OTLP/gRPC: %v, want %v", err, want)
		}
	}
	postEvents := func(want int) {
		t.Helper()
		resp, err := cl.Post(ing.URL, "application/x-ndjson", strings.NewReader(events))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("ingest: %d %s, want %d", resp.StatusCode, b, want)
		}
		if want == http.StatusServiceUnavailable && (resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(b), "holding its limit of request bodies")) {
			t.Fatalf("ingest 503: Retry-After %q, %s", resp.Header.Get("Retry-After"), b)
		}
	}
	waitHeld := func(want int64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); budget.Held() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes held, want %d", budget.Held(), want)
			}
		}
	}

	// An ingest body arriving takes the whole budget.
	c, err := net.Dial("tcp", ing.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(events), events[:70<<10])
	waitHeld(int64(len(events)))
	exportHTTP(http.StatusServiceUnavailable)
	exportGRPC(codes.Unavailable)
	if _, err := io.WriteString(c, events[70<<10:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the held ingest body: %v %v", resp, err)
	}
	waitHeld(0)
	exportHTTP(http.StatusOK)
	exportGRPC(codes.OK)

	// A gRPC export in its handler holds the largest message's worth until its stream ends.
	gate := pub.hold()
	var open sync.Once
	release := func() { open.Do(func() { close(gate) }) }
	defer release()
	held := make(chan error, 1)
	go func() { _, err := client.Export(context.Background(), batchOf(2, nil)); held <- err }()
	select {
	case <-pub.entered:
	case err := <-held:
		t.Fatalf("the export to hold ended: %v", err)
	}
	if budget.Held() != 2*maxBytes {
		t.Fatalf("%d bytes held by a gRPC export, want twice the largest message, %d", budget.Held(), 2*maxBytes)
	}
	postEvents(http.StatusServiceUnavailable)
	exportGRPC(codes.Unavailable)
	release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	waitHeld(0)
	postEvents(http.StatusAccepted)
	exportGRPC(codes.OK)

	// One whose client gives up: its stream is reset, and that ends its hold too.
	gate2 := pub.hold()
	defer close(gate2)
	gone, giveUp := context.WithCancel(context.Background())
	go func() { _, err := client.Export(gone, batchOf(2, nil)); held <- err }()
	select {
	case <-pub.entered:
	case err := <-held:
		t.Fatalf("the export to give up ended: %v", err)
	}
	giveUp()
	if err := <-held; status.Code(err) != codes.Canceled {
		t.Fatalf("the export given up: %v", err)
	}
	waitHeld(0)
	exportGRPC(codes.OK)

	// A compressed one holds as much: grpc-go keeps the message beside its decompressed form.
	gate3 := pub.hold()
	go func() {
		_, err := client.Export(context.Background(), batchOf(2, nil), grpc.UseCompressor(gzip.Name))
		held <- err
	}()
	select {
	case <-pub.entered:
	case err := <-held:
		t.Fatalf("the compressed export to hold ended: %v", err)
	}
	if budget.Held() != 2*maxBytes {
		t.Fatalf("%d bytes held by a compressed gRPC export, want twice the largest message, %d", budget.Held(), 2*maxBytes)
	}
	close(gate3)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	waitHeld(0)

	for route, want := range map[string]float64{"ingest": 1, "otlp_http": 1, "otlp_grpc": 2} {
		if n := testutil.ToFloat64(budget.Refusals(route)); n != want {
			t.Errorf("refused{route=%q} = %v, want %v", route, n, want)
		}
	}
}
