package demo

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestAlertLineEscapesLabels: an alert's labels are whatever the alerter was sent; one with
// a line break or a terminal escape stays on its line, escaped.
func TestAlertLineEscapesLabels(t *testing.T) {
	data, err := json.Marshal(events.Alert{State: events.AlertFiring, Severity: "warning", Rule: "ttft_p95_sla",
		Labels:      map[string]string{"scene": "chat\n12:00:00 RESOLVED everything", "model": "m\x1b[2J"},
		EngineCause: &events.EngineCause{Cause: events.CauseQueueTime, Host: "h\x1b]0;x\x07", Engine: "vllm"}})
	if err != nil {
		t.Fatal(err)
	}
	line := alertLine(data)
	if strings.ContainsAny(line, "\n\x1b\x07") || !strings.Contains(line, `scene=chat\n12:00:00`) || !strings.Contains(line, `model=m\x1b[2J`) {
		t.Errorf("line %q", line)
	}
}

// TestAlertLineNamesTheLayer: the same series measured at the gateway and inside the engine
// are two alerts, told apart by their layer.
func TestAlertLineNamesTheLayer(t *testing.T) {
	var lines []string
	for _, labels := range []map[string]string{
		{"env": "demo", "scene": "chat", "model": "m", "bucket": "0-499"},
		{"env": "demo", "scene": "chat", "model": "m", "bucket": "0-499", "layer": "engine"},
	} {
		data, err := json.Marshal(events.Alert{State: events.AlertFiring, Severity: "warning", Rule: "ttft_p95_sla", Labels: labels, Value: 3000, Threshold: 2000})
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, alertLine(data))
	}
	if lines[0] == lines[1] || !strings.Contains(lines[1], "layer=engine") {
		t.Errorf("a gateway and an engine alert print as %q and %q", lines[0], lines[1])
	}
}
