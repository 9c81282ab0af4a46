package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/report"
	"github.com/tokenscope/tokenscope/pkg/chdb"
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

// readmeCommands returns the shell commands of a Markdown file's ```sh blocks, one per
// command (a line continued with a backslash is joined to the next), split into words as
// the shell would (single and double quotes; an unquoted # starts a comment).
func readmeCommands(t *testing.T, path string) [][]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	in := false
	cont := ""
	for _, line := range strings.Split(string(raw), "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in = true
			continue
		case in && strings.HasPrefix(strings.TrimSpace(line), "```"):
			in = false
			continue
		case !in:
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cont += s + " "
			continue
		}
		words, err := shellWords(cont + line)
		cont = ""
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(words) > 0 {
			out = append(out, words)
		}
	}
	return out
}

func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(line[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed quote in %q", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// TestReadmeCommands checks the commands the READMEs show: every `tokenscope report` and
// `tokenscope demo` (or scripts/demo.sh) line parses with the command's own flags, a
// `--sql` file exists and its parameters are the `--param`s given (with values of their
// types), and a `clickhouse-client --param_…` line names the parameters of its file. The
// root README's table of the SQL cookbook lists every file of schemas/clickhouse/queries.
func TestReadmeCommands(t *testing.T) {
	root := rootDir(t)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	checked := map[string]int{}
	for _, doc := range []string{"README.md", "cli/README.md", "schemas/README.md", "deploy/README.md"} {
		for _, w := range readmeCommands(t, filepath.Join(root, doc)) {
			cmd := strings.Join(w, " ")
			switch {
			case filepath.Base(w[0]) == "tokenscope" && len(w) > 1 && w[1] == "report":
				a, err := parseReportArgs(w[2:], now, time.UTC, io.Discard)
				if err != nil {
					t.Errorf("%s: %s: %v", doc, cmd, err)
					continue
				}
				if a.sqlFile != "" {
					if _, err := readSQL(filepath.Join(root, a.sqlFile), a.params, now, time.UTC); err != nil {
						t.Errorf("%s: %s: %v", doc, cmd, err)
					}
				}
			case filepath.Base(w[0]) == "tokenscope" && len(w) > 1 && w[1] == "demo", filepath.Base(w[0]) == "demo.sh":
				args := w[1:]
				if filepath.Base(w[0]) == "tokenscope" {
					args = w[2:]
				}
				if _, err := parseDemoArgs(args, root, t.TempDir(), false, io.Discard); err != nil {
					t.Errorf("%s: %s: %v", doc, cmd, err)
				}
			case w[0] == "clickhouse-client" && strings.Contains(cmd, "--param_"):
				var file string
				given := map[string]bool{}
				for i, a := range w {
					if (a == "<" || a == "--queries-file") && i+1 < len(w) {
						file = w[i+1]
					}
					if name, ok := strings.CutPrefix(a, "--param_"); ok {
						name, _, _ = strings.Cut(name, "=")
						given[name] = true
					}
				}
				raw, err := os.ReadFile(filepath.Join(root, file))
				if err != nil {
					t.Errorf("%s: %s: %v", doc, cmd, err)
					continue
				}
				want := map[string]bool{}
				for _, p := range chdb.Params(string(raw)) {
					want[p.Name] = true
				}
				if !maps.Equal(given, want) {
					t.Errorf("%s: %s: gives the parameters %v, %s has %v", doc, cmd, slices.Sorted(maps.Keys(given)), file, slices.Sorted(maps.Keys(want)))
				}
			default:
				continue
			}
			checked[doc]++
		}
	}
	t.Logf("commands checked: %v", checked)
	if checked["README.md"] < 8 || checked["cli/README.md"] < 10 {
		t.Fatalf("only %v commands found", checked)
	}

	// The cookbook table: a row per query file, and no row for a file that is not there.
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.Contains(cells[1], ".sql`") {
			continue
		}
		for _, m := range regexp.MustCompile("`([a-z0-9_]+\\.sql)`").FindAllStringSubmatch(cells[1], -1) {
			listed[m[1]] = true
		}
	}
	files, err := filepath.Glob(filepath.Join(root, "schemas", "clickhouse", "queries", "*.sql"))
	if err != nil || len(files) < 10 {
		t.Fatalf("cookbook: %d files, %v", len(files), err)
	}
	for _, f := range files {
		if !listed[filepath.Base(f)] {
			t.Errorf("README.md: the cookbook table has no row for %s", filepath.Base(f))
		}
		delete(listed, filepath.Base(f))
	}
	for name := range listed {
		t.Errorf("README.md: the cookbook table lists %s, which schemas/clickhouse/queries does not hold", name)
	}
}

// TestDemoFlagTable checks cli/README.md's table of the demo's flags against the flags
// tokenscope demo defines: one row each, no row for a flag it lacks, and the default it
// prints where the table gives one as a value.
func TestDemoFlagTable(t *testing.T) {
	var usage strings.Builder
	if _, err := parseDemoArgs([]string{"-h"}, "/src", "/nonexistent", false, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	// flag -> its default as the usage prints it: nothing for a zero value (false for a
	// bool, whose line names no type), and nothing known for a flag.Func ("value").
	defaults := map[string]string{}
	known := map[string]bool{}
	flagLine := regexp.MustCompile(`^  -([a-z-]+)(?: (\w+))?`)
	defaultRE := regexp.MustCompile(`\(default "?([^")]*)"?\)$`)
	last := ""
	for _, line := range strings.Split(usage.String(), "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			last = m[1]
			defaults[last], known[last] = "", m[2] != "value"
			if m[2] == "" {
				defaults[last] = "false"
			}
		}
		if m := defaultRE.FindStringSubmatch(line); m != nil && last != "" {
			defaults[last] = m[1]
		}
	}
	if len(defaults) < 10 {
		t.Fatalf("only %d flags in the usage:\n%s", len(defaults), usage.String())
	}
	raw, err := os.ReadFile(filepath.Join(rootDir(t), "cli", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		m := regexp.MustCompile("^`--([a-z-]+)`$").FindStringSubmatch(strings.TrimSpace(cells[1]))
		if m == nil {
			continue
		}
		name := m[1]
		rows[name] = true
		def, ok := defaults[name]
		if !ok {
			t.Errorf("cli/README.md: --%s is in the demo's table, but tokenscope demo has no such flag", name)
			continue
		}
		cell := strings.TrimSpace(cells[2])
		v, isValue := strings.CutPrefix(cell, "`")
		v = strings.TrimSuffix(v, "`")
		if !isValue || strings.ContainsAny(v, "$<") {
			continue // a default in words, or one that depends on the machine
		}
		if !known[name] || v == def {
			continue
		}
		if d, err := time.ParseDuration(v); err == nil && d.String() == def {
			continue
		}
		t.Errorf("cli/README.md: --%s defaults to %q, the table says %q", name, def, v)
	}
	for name := range defaults {
		if !rows[name] {
			t.Errorf("cli/README.md: tokenscope demo's --%s has no row in the table of its flags", name)
		}
	}
}
