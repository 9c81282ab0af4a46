package report

import (
	"strings"
	"testing"
	"time"
)

func TestParseTime(t *testing.T) {
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	f := func(in string, want time.Time) {
		t.Helper()
		got, err := ParseTime(in, now, paris)
		if err != nil {
			t.Fatalf("ParseTime(%q): %v", in, err)
		}
		if !got.Equal(want) {
			t.Fatalf("ParseTime(%q) = %s, want %s", in, got, want)
		}
	}
	f("now", now)
	f("now-2h", now.Add(-2*time.Hour))
	f("-90m", now.Add(-90*time.Minute))
	f("2026-03-01T08:00:00Z", time.Date(2026, 3, 1, 8, 0, 0, 0, time.UTC))
	f("2026-03-01T08:00:00+02:00", time.Date(2026, 3, 1, 6, 0, 0, 0, time.UTC))
	f("2026-03-01 08:00", time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC)) // Paris is UTC+1 in March
	f("2026-03-01", time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC))
	for _, bad := range []string{"", "yesterday", "now-", "now+1h", "-x", "2026-13-01"} {
		if _, err := ParseTime(bad, now, paris); err == nil {
			t.Fatalf("ParseTime(%q) accepted", bad)
		}
	}
}

func TestWriteTable(t *testing.T) {
	from := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	rep := Report{Range: Range{From: from, To: from.Add(time.Hour)}, Filter: Filter{Scene: "chat"},
		First: from, End: from.Add(time.Minute),
		Rows: []Row{
			{Model: "qwen", Scene: "chat", Bucket: "0-500", Requests: 120, TTFT: Percentiles{N: 118, P50: 212.4, P95: 1830, P99: 2950.2},
				TPOT: Percentiles{N: 110, P50: 21.26, P95: 35.5, P99: 8.123}, OutputTPS: 1234.5, ErrorRate: 0.0125, TimeoutRate: 0.005},
			{Model: "qwen", Scene: "chat", Bucket: "2000-8000", Requests: 3, ErrorRate: 1},
		}}
	var b strings.Builder
	if err := WriteTable(&b, rep); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"2026-03-02 10:00:00 → 2026-03-02 11:00:00 UTC, scene=chat (windows cover 1m0s)",
		"TTFT p50", "212", "1830", "2950", "21.3", "35.5", "8.12", "1234", "1.25%", "0.50%", "100.00%"} {
		if !strings.Contains(out, want) {
			t.Fatalf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.Contains(lines[3], "2000-8000") || strings.Count(lines[3], " - ") < 5 {
		t.Fatalf("errors-only row should show - for every latency:\n%s", out)
	}

	b.Reset()
	if err := WriteTable(&b, Report{Range: rep.Range}); err != nil || !strings.Contains(b.String(), "no requests in this range") {
		t.Fatalf("empty report: %v\n%s", err, b.String())
	}
}

func TestWriteComparison(t *testing.T) {
	from := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	before := Report{Range: Range{From: from, To: from.Add(time.Hour)}, Rows: []Row{
		{Model: "m", Scene: "s", Bucket: "500-2000", BucketLo: 500, Requests: 50, TTFT: Percentiles{N: 50, P50: 300, P95: 400, P99: 500}}}}
	after := Report{Range: Range{From: from.Add(time.Hour), To: from.Add(2 * time.Hour)}, Rows: []Row{
		{Model: "m", Scene: "s", Bucket: "500-2000", BucketLo: 500, Requests: 60, TTFT: Percentiles{N: 60, P50: 300, P95: 600, P99: 450}},
		{Model: "m", Scene: "s", Bucket: "0-500", Requests: 7, TTFT: Percentiles{N: 7, P50: 90, P95: 95, P99: 99}}}}
	var b strings.Builder
	if err := WriteComparison(&b, Compare(before, after)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"before: 2026-03-02 10:00:00", "after:  2026-03-02 11:00:00", "50 → 60", "400 → 600 (+50%)",
		"500 → 450 (-10%)", "300 → 300 (+0%)", "0 → 7", "- → 95.0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("comparison lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "0-500") > strings.Index(out, "500-2000") {
		t.Fatalf("buckets out of order:\n%s", out)
	}
}

// TestHostileLabels: labels are the producers' (a model name, a host), and may hold tabs,
// line breaks and terminal escapes. Every table shows them escaped, so none forges a row,
// shifts a column or drives the terminal.
func TestHostileLabels(t *testing.T) {
	from := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	rng := Range{From: from, To: from.Add(time.Hour)}
	const model, scene = "m\n999 forged\trow\r", "chat\x1b[2J\x1b]0;pwned\x07\u0085\u202e"
	row := Row{Model: model, Scene: scene, Bucket: "0-500", Requests: 1}
	rep := Report{Range: rng, Filter: Filter{Model: model}, Rows: []Row{row}}
	var b strings.Builder
	check := func(name string, err error, lines int) {
		t.Helper()
		out := b.String()
		b.Reset()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if n := strings.Count(out, "\n"); n != lines || strings.ContainsAny(out, "\x1b\x07\r\u0085\u202e") || strings.Contains(out, "forged\t") {
			t.Errorf("%s: %d lines, want %d, or control characters left:\n%q", name, n, lines, out)
		}
		if !strings.Contains(out, `m\n999 forged\trow\r`) {
			t.Errorf("%s: the model is not shown escaped:\n%q", name, out)
		}
	}
	check("table", WriteTable(&b, rep), 4)
	check("comparison", WriteComparison(&b, Compare(rep, rep)), 5)
	check("layers", WriteLayers(&b, LayersReport{Range: rng, Filter: Filter{Model: model},
		Rows: []LayerRow{{Model: model, Scene: scene, Bucket: "0-500", Layers: []LayerCell{{Requests: 1}}}}}), 4)
	check("engines", WriteEngineTable(&b, EngineReport{Range: rng, Filter: Filter{Model: model},
		Rows: []EngineRow{{Host: scene, Name: "vllm", Engine: "vllm", Model: model}}}), 4)
	check("answer", WriteAnswer(&b, Answer{Columns: []string{"model", "scene"}, Rows: [][]any{{model, scene}}}), 3)
}
