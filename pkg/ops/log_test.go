package ops_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/ops"
)

func TestLoggerWritesDurationsAsStrings(t *testing.T) {
	var buf bytes.Buffer
	logger := ops.NewLogger(&buf, slog.LevelInfo, "aggregator")
	logger.Info("aggregating", "window", 15*time.Second, slog.Group("flush", "every", time.Second, "rows", 3), "lateness", 1500*time.Millisecond)
	logger.Debug("not at info")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	for k, want := range map[string]any{"service": "aggregator", "window": "15s", "lateness": "1.5s", "msg": "aggregating"} {
		if line[k] != want {
			t.Errorf("%s = %v, want %v (line %s)", k, line[k], want, buf.Bytes())
		}
	}
	if g, _ := line["flush"].(map[string]any); g["every"] != "1s" || g["rows"] != 3.0 {
		t.Errorf("group flush = %v", line["flush"])
	}
}

func TestTotals(t *testing.T) {
	s := ops.NewServer("127.0.0.1:0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	rows := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "aggregator", Name: "rows_written_total"}, []string{"stream"})
	held := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "aggregator", Name: "publish_buffered_messages"})
	s.Registry().MustRegister(rows, held)
	rows.WithLabelValues("tokens").Add(40)
	rows.WithLabelValues("gpu").Add(2)
	held.Set(7)
	got := s.Totals("aggregator_rows_written_total", "aggregator_publish_buffered_messages", "aggregator_absent_total")
	want := []any{"rows_written", int64(42), "publish_buffered_messages", int64(7), "absent", int64(0)}
	if len(got) != len(want) {
		t.Fatalf("Totals = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Totals = %v, want %v", got, want)
		}
	}
}
