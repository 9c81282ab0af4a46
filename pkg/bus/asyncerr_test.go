package bus

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A slow consumer reports thousands of times a second: one line per kind, then one per period.
func TestAsyncErrorsLogOncePerKind(t *testing.T) {
	var buf bytes.Buffer
	h := asyncErrors(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	for range 1000 {
		h(nil, nil, nats.ErrSlowConsumer)
	}
	h(nil, nil, errors.New("permissions violation"))
	h(nil, nil, nil)
	if n := strings.Count(buf.String(), "\n"); n != 2 {
		t.Fatalf("%d lines, want one per kind of error:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "slow consumer") || !strings.Contains(buf.String(), "permissions violation") {
		t.Fatalf("log does not name the errors:\n%s", buf.String())
	}
}
