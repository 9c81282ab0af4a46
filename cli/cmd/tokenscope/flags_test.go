package main

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/report"
)

func TestParseReportArgs(t *testing.T) {
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	rng := func(a, b time.Time) report.Range { return report.Range{From: a, To: b} }
	for _, tc := range []struct {
		name        string
		args        []string
		want        report.Range
		wantCompare *report.Range
		wantFilter  report.Filter
		wantJSON    bool
		wantEngine  bool
		wantErr     string
	}{
		{name: "default is the last hour", want: rng(now.Add(-time.Hour), now)},
		{name: "last", args: []string{"--last", "15m"}, want: rng(now.Add(-15*time.Minute), now)},
		{name: "from to", args: []string{"--from", "2026-03-01T10:00:00Z", "--to", "2026-03-01T11:30:00Z"},
			want: rng(at("2026-03-01T10:00:00Z"), at("2026-03-01T11:30:00Z"))},
		{name: "relative from", args: []string{"--from", "now-2h"}, want: rng(now.Add(-2*time.Hour), now)},
		{name: "to with last", args: []string{"--to", "2026-03-01T11:00:00Z", "--last", "30m"},
			want: rng(at("2026-03-01T10:30:00Z"), at("2026-03-01T11:00:00Z"))},
		{name: "filters and json", args: []string{"--model", "qwen2.5-72b", "--scene", "chat", "--env", "prod", "--json"},
			want: rng(now.Add(-time.Hour), now), wantFilter: report.Filter{Model: "qwen2.5-72b", Scene: "chat", Env: "prod"}, wantJSON: true},
		{name: "compare", args: []string{"--last", "1h", "--compare-from", "now-25h", "--compare-to", "now-24h"},
			want: rng(now.Add(-time.Hour), now), wantCompare: &report.Range{From: now.Add(-25 * time.Hour), To: now.Add(-24 * time.Hour)}},
		{name: "change", args: []string{"--change", "2026-03-02T09:00:00Z", "--last", "30m"},
			want:        rng(at("2026-03-02T09:00:00Z"), at("2026-03-02T09:30:00Z")),
			wantCompare: &report.Range{From: at("2026-03-02T08:30:00Z"), To: at("2026-03-02T09:00:00Z")}},
		{name: "layer", args: []string{"--layer", "engine"}, want: rng(now.Add(-time.Hour), now), wantFilter: report.Filter{Layer: "engine"}},
		{name: "bad layer", args: []string{"--layer", "proxy"}, wantErr: `"proxy" is not a layer`},
		{name: "layers", args: []string{"--layers", "--env", "prod"}, want: rng(now.Add(-time.Hour), now), wantFilter: report.Filter{Env: "prod"}},
		{name: "layers with layer", args: []string{"--layers", "--layer", "app"}, wantErr: "without --layer"},
		{name: "layers with change", args: []string{"--layers", "--change", "now-1h"}, wantErr: "--layers reads one range"},
		{name: "from and last", args: []string{"--from", "now-1h", "--last", "1h"}, wantErr: "--from and --last"},
		{name: "empty range", args: []string{"--from", "now", "--to", "now-1h"}, wantErr: "the range is empty"},
		{name: "bad time", args: []string{"--from", "yesterday"}, wantErr: "--from:"},
		{name: "compare half", args: []string{"--compare-from", "now-2h"}, wantErr: "go together"},
		{name: "compare empty", args: []string{"--compare-from", "now-1h", "--compare-to", "now-2h"}, wantErr: "comparison range is empty"},
		{name: "change with from", args: []string{"--change", "now-1h", "--from", "now-3h"}, wantErr: "--change sets both ranges"},
		{name: "negative last", args: []string{"--last", "-1h"}, wantErr: "--last=-1h0m0s must be positive"},
		{name: "argument", args: []string{"yesterday"}, wantErr: "unexpected argument"},
		{name: "unknown flag", args: []string{"--since", "1h"}, wantErr: "flag provided but not defined"},
		{name: "sql", args: []string{"--sql", "q.sql", "--param", "from=now-1h", "--param", "model=a=b", "--json"}, wantJSON: true},
		{name: "sql with a range", args: []string{"--sql", "q.sql", "--last", "1h"}, wantErr: "--sql takes its values from --param, not --last"},
		{name: "param without sql", args: []string{"--param", "a=b"}, wantErr: "--param goes with --sql"},
		{name: "param not name=value", args: []string{"--sql", "q.sql", "--param", "ab"}, wantErr: `"ab" is not name=value`},
		{name: "param twice", args: []string{"--sql", "q.sql", "--param", "a=1", "--param", "a=2"}, wantErr: "a given twice"},
		{name: "engine", args: []string{"--engine", "--model", "llama", "--last", "15m"}, want: rng(now.Add(-15*time.Minute), now),
			wantFilter: report.Filter{Model: "llama"}, wantEngine: true},
		{name: "engine with scene", args: []string{"--engine", "--scene", "chat"}, wantErr: "--engine takes a range and --model"},
		{name: "engine with compare", args: []string{"--engine", "--change", "now-1h"}, wantErr: "--engine takes a range and --model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseReportArgs(tc.args, now, time.UTC, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.main.From.Equal(tc.want.From) || !got.main.To.Equal(tc.want.To) {
				t.Fatalf("range %v, want %v", got.main, tc.want)
			}
			if (got.compare == nil) != (tc.wantCompare == nil) ||
				got.compare != nil && (!got.compare.From.Equal(tc.wantCompare.From) || !got.compare.To.Equal(tc.wantCompare.To)) {
				t.Fatalf("compare %v, want %v", got.compare, tc.wantCompare)
			}
			if got.engine != tc.wantEngine {
				t.Fatalf("engine %v, want %v", got.engine, tc.wantEngine)
			}
			if got.filter != tc.wantFilter || got.json != tc.wantJSON {
				t.Fatalf("filter %+v json %v, want %+v %v", got.filter, got.json, tc.wantFilter, tc.wantJSON)
			}
		})
	}
}

func TestParseDemoArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "defaults"},
		{name: "all", args: []string{"--any-port", "--gpu", "synthetic", "--speed", "4", "--window", "5s", "--view", "1m", "--refresh", "1s", "--plain", "--build=false"}},
		{name: "gpu", args: []string{"--gpu", "amd"}, wantErr: `--gpu="amd"`},
		{name: "speed", args: []string{"--speed", "0"}, wantErr: "--speed=0"},
		{name: "window", args: []string{"--window", "1500ms"}, wantErr: "--window=1.5s"},
		{name: "window over a day", args: []string{"--window", "25h"}, wantErr: "--window=25h0m0s"},
		{name: "view", args: []string{"--window", "1m", "--view", "30s"}, wantErr: "--view=30s"},
		{name: "refresh", args: []string{"--refresh", "10ms"}, wantErr: "--refresh=10ms"},
		{name: "argument", args: []string{"now"}, wantErr: "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseDemoArgs(tc.args, "/src/tokenscope", "/nonexistent", true, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.BinDir != "/src/tokenscope/bin" || o.GPU == "" || o.Window%time.Second != 0 {
				t.Fatalf("options %+v", o)
			}
		})
	}
	if _, err := parseDemoArgs([]string{"-h"}, "/src", "/nonexistent", false, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

// TestDemoTraceDefault: the proxied load replays the conversation trace from
// TOKENSCOPE_TRACES (else ../shared/traces beside the checkout) when it is there, and the
// generated workload when it is not.
func TestDemoTraceDefault(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "tokenscope")
	if got := tracesDir(root, func(string) string { return "" }); got != filepath.Join(dir, "shared", "traces") {
		t.Fatalf("tracesDir without TOKENSCOPE_TRACES = %q", got)
	}
	if got := tracesDir(root, func(k string) string { return map[string]string{"TOKENSCOPE_TRACES": "/t"}[k] }); got != "/t" {
		t.Fatalf("tracesDir with TOKENSCOPE_TRACES = %q", got)
	}
	o, err := parseDemoArgs(nil, root, dir, false, io.Discard)
	if err != nil || o.Trace != "" {
		t.Fatalf("no trace in %s: trace %q, %v", dir, o.Trace, err)
	}
	want := filepath.Join(dir, defaultTrace)
	if err := os.WriteFile(want, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err = parseDemoArgs(nil, root, dir, false, io.Discard); err != nil || o.Trace != want {
		t.Fatalf("trace %q, %v; want %q", o.Trace, err, want)
	}
}

func TestLoadConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{name: "defaults"},
		{name: "set", env: map[string]string{"CLICKHOUSE_ADDR": "ch:9000", "CLICKHOUSE_DB": "obs", "CLICKHOUSE_TLS": "true"}},
		{name: "bad db", env: map[string]string{"CLICKHOUSE_DB": "a-b"}, wantErr: "CLICKHOUSE_DB"},
		{name: "bad bool", env: map[string]string{"CLICKHOUSE_TLS": "maybe"}, wantErr: `CLICKHOUSE_TLS="maybe"`},
		{name: "bad duration", env: map[string]string{"CLICKHOUSE_DIAL_TIMEOUT": "soon"}, wantErr: "CLICKHOUSE_DIAL_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := loadConfig(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.env["CLICKHOUSE_ADDR"]; want != "" && cfg.ClickHouse.Addr != want {
				t.Fatalf("addr %q", cfg.ClickHouse.Addr)
			}
		})
	}
}

func TestRunUsage(t *testing.T) {
	var out strings.Builder
	if err := run(t.Context(), nil, func(string) string { return "" }, &out, &out); err == nil || !strings.Contains(out.String(), "usage: tokenscope") {
		t.Fatalf("no command: %v\n%s", err, out.String())
	}
	if err := run(t.Context(), []string{"deploy"}, func(string) string { return "" }, &out, &out); err == nil || !strings.Contains(err.Error(), `unknown command "deploy"`) {
		t.Fatalf("unknown command: %v", err)
	}
}
