package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

func TestServer(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	dbErr := errors.New("ClickHouse at 127.0.0.1:9000 does not answer")
	s.AddCheck("clickhouse", func(context.Context) error { mu.Lock(); defer mu.Unlock(); return dbErr })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Second) }()
	base := "http://" + s.Addr()

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	code, body := get("/readyz")
	var r struct {
		Ready  bool
		Failed map[string]string
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || code != 503 || r.Ready || !strings.Contains(r.Failed["clickhouse"], "does not answer") {
		t.Fatalf("/readyz %d %s", code, body)
	}
	mu.Lock()
	dbErr = nil
	mu.Unlock()
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz after recovery: %d", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics %d", code)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestListenError(t *testing.T) {
	s := ops.NewServer("256.0.0.1:99999", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Listen(); err == nil || !strings.Contains(err.Error(), "HTTP_ADDR") {
		t.Fatalf("got %v", err)
	}
}

func TestLimiter(t *testing.T) {
	l := ops.NewLimiter(2)
	got := []string{l.Value("a"), l.Value("b"), l.Value("c"), l.Value("a"), l.Value("d")}
	if strings.Join(got, ",") != "a,b,other,a,other" || l.Folded() != 2 {
		t.Fatalf("got %v, folded %d", got, l.Folded())
	}
}
