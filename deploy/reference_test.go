package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/tokenscope/tokenscope/deploy/internal/srcconfig"
)

// referenceServices are the services whose README's reference tables are checked against
// their source: every services/<name> with a main package.
func referenceServices(t *testing.T) []string {
	t.Helper()
	mains, err := filepath.Glob(filepath.Join(repoRoot, "services", "*", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mains {
		out = append(out, filepath.Base(filepath.Dir(m)))
	}
	slices.Sort(out)
	if len(out) < 4 {
		t.Fatalf("only %d services found: %v", len(out), out)
	}
	return out
}

// checkRootREADME makes TestRootREADMEReference fail on what the root README's configuration
// tables miss or get wrong; while it is false the test only logs it (go test -v -run
// TestRootREADMEReference) and skips.
const checkRootREADME = true

// TestServiceREADMEReference checks each service's README against what the service's
// binary reads and registers, found in its Go source (srcconfig.Program): every
// environment variable has one row in a table headed `variable`, with the code's default,
// and every row names a variable the code reads; every metric has a row in a table headed
// `metric`, and every row names a metric the code defines.
func TestServiceREADMEReference(t *testing.T) {
	src := srcconfig.NewReader(repoRoot)
	for _, svc := range referenceServices(t) {
		t.Run(svc, func(t *testing.T) {
			code := readCode(t, src, svc)
			readme := filepath.Join(repoRoot, "services", svc, "README.md")
			tables := readTables(t, readme)
			for _, p := range append(compareVariables(code.vars, tables, "the code"), compareMetrics(code.metrics, tables)...) {
				t.Errorf("%s: %s", rel(readme), p)
			}
		})
	}
}

// TestRootREADMEReference checks the root README's configuration tables: the table under
// each service's heading (### aggregator, …) and the shared one (### Shared …) together
// hold every variable of that service with its default, and no other.
func TestRootREADMEReference(t *testing.T) {
	src := srcconfig.NewReader(repoRoot)
	readme := filepath.Join(repoRoot, "README.md")
	tables := readTables(t, readme)
	var shared []mdTable
	for _, tb := range tables {
		if strings.HasPrefix(strings.ToLower(tb.heading), "shared") {
			shared = append(shared, tb)
		}
	}
	var problems []string
	anyReads := map[string]string{} // variable -> default, over every service
	for _, svc := range referenceServices(t) {
		code := readCode(t, src, svc)
		var own []mdTable
		for _, tb := range tables {
			if strings.EqualFold(tb.heading, svc) {
				own = append(own, tb)
			}
		}
		if len(own) == 0 {
			problems = append(problems, fmt.Sprintf("no table under a heading %q", svc))
		}
		// Every variable of the service, in its table or the shared one, with its default.
		for _, p := range compareVariables(code.vars, append(own, shared...), "the code") {
			if p.kind != extra {
				problems = append(problems, svc+": "+p.String())
			}
		}
		// The service's own table: nothing the service does not read.
		for _, p := range compareVariables(code.vars, own, "the code") {
			if p.kind == extra {
				problems = append(problems, svc+": "+p.String())
			}
		}
		for k, v := range code.vars {
			anyReads[k] = v
		}
	}
	// The shared table: nothing that no service reads.
	for _, p := range compareVariables(anyReads, shared, "the code") {
		if p.kind == extra || p.kind == malformed {
			problems = append(problems, "shared: "+p.String())
		}
	}
	slices.Sort(problems)
	problems = slices.Compact(problems)
	for _, p := range problems {
		if checkRootREADME {
			t.Errorf("README.md: %s", p)
		} else {
			t.Logf("README.md: %s", p)
		}
	}
	if !checkRootREADME {
		t.Skipf("the root README is not checked yet (%d problems logged): set checkRootREADME", len(problems))
	}
}

// code is what one service's binary reads and defines.
type code struct {
	vars    map[string]string // variable -> default
	metrics map[string]string // metric -> where it is defined
}

// envVars returns the variables services/<svc> reads, with the code's defaults.
func envVars(t *testing.T, src *srcconfig.Reader, svc string) map[string]string {
	t.Helper()
	prog, err := src.Program("services/" + svc)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := prog.EnvVars()
	if err != nil {
		t.Fatalf("services/%s: %v", svc, err)
	}
	return vars
}

func readCode(t *testing.T, src *srcconfig.Reader, svc string) code {
	t.Helper()
	prog, err := src.Program("services/" + svc)
	if err != nil {
		t.Fatal(err)
	}
	vars, err := prog.EnvVars()
	if err != nil {
		t.Fatalf("services/%s: %v", svc, err)
	}
	metrics, err := prog.Metrics()
	if err != nil {
		t.Fatalf("services/%s: %v", svc, err)
	}
	if len(vars) < 10 || len(metrics) < 10 {
		t.Fatalf("services/%s: only %d variables and %d metrics found in the source", svc, len(vars), len(metrics))
	}
	return code{vars, metrics}
}

// mdTable is one Markdown table: the heading it is under, its header cells and its rows.
type mdTable struct {
	heading string
	header  []string
	rows    []mdRow
}

type mdRow struct {
	line  int
	cells []string
}

// readTables returns the tables of a Markdown file, outside fenced code blocks.
func readTables(t *testing.T, path string) []mdTable {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return parseTables(string(data))
}

var separatorRow = regexp.MustCompile(`^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$`)

func parseTables(md string) []mdTable {
	lines := strings.Split(md, "\n")
	var out []mdTable
	heading, fence := "", ""
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if fence != "" {
			if strings.HasPrefix(line, fence) {
				fence = ""
			}
			continue
		}
		switch {
		case strings.HasPrefix(line, "```"), strings.HasPrefix(line, "~~~"):
			fence = line[:3]
			continue
		case strings.HasPrefix(line, "#"):
			heading = strings.TrimSpace(strings.TrimLeft(line, "#"))
			continue
		}
		if !strings.HasPrefix(line, "|") || i+1 >= len(lines) || !separatorRow.MatchString(strings.TrimSpace(lines[i+1])) {
			continue
		}
		tb := mdTable{heading: heading, header: splitRow(line)}
		for i += 2; i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "|"); i++ {
			tb.rows = append(tb.rows, mdRow{line: i + 1, cells: splitRow(strings.TrimSpace(lines[i]))})
		}
		i--
		out = append(out, tb)
	}
	return out
}

// splitRow splits a table row at its unescaped pipes (GitHub splits a row before it reads
// code spans, so a pipe inside backticks is escaped too), and unescapes them.
func splitRow(line string) []string {
	line = strings.TrimPrefix(line, "|")
	if strings.HasSuffix(line, "|") && !strings.HasSuffix(line, `\|`) {
		line = line[:len(line)-1]
	}
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

func codeSpans(cell string) []string {
	var out []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		out = append(out, m[1])
	}
	return out
}

// tablesHeaded returns the tables whose first header cell is name.
func tablesHeaded(tables []mdTable, name string) []mdTable {
	var out []mdTable
	for _, tb := range tables {
		if len(tb.header) > 0 && strings.EqualFold(tb.header[0], name) {
			out = append(out, tb)
		}
	}
	return out
}

var (
	varName    = regexp.MustCompile(`^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$`)
	varSuffix  = regexp.MustCompile(`^(_[A-Z0-9]+)+$`)
	metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
)

// rowVariables returns the variables a row's first cell names: each in backticks, or as a
// suffix (`_SEED`) that replaces as many trailing words of the cell's first name.
func rowVariables(cell string) ([]string, error) {
	var out []string
	for _, s := range codeSpans(cell) {
		switch {
		case varName.MatchString(s):
			out = append(out, s)
		case varSuffix.MatchString(s) && len(out) > 0:
			words := strings.Split(out[0], "_")
			n := strings.Count(s, "_")
			if n >= len(words) {
				return nil, fmt.Errorf("%s is longer than %s", s, out[0])
			}
			out = append(out, strings.Join(words[:len(words)-n], "_")+s)
		default:
			return nil, fmt.Errorf("%q is not a variable's name (list every variable, without wildcards)", s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no variable in %q", cell)
	}
	return out, nil
}

// problem is one difference between a reference table and the code.
type problem struct {
	kind problemKind
	line int // in the README; 0 for what has no row
	msg  string
}

type problemKind int

const (
	missing   problemKind = iota // in the code, without a row
	extra                        // a row for what the code does not have
	mismatch                     // a row that says other than the code (a default)
	malformed                    // a row that cannot be read, or a second row
)

func (p problem) String() string {
	if p.line == 0 {
		return p.msg
	}
	return fmt.Sprintf("line %d: %s", p.line, p.msg)
}

// compareVariables returns what the `variable` tables get wrong against vars (variable ->
// default): a variable without a row, a row for a variable not read, a variable in two
// rows, and a default that is not the code's.
func compareVariables(vars map[string]string, tables []mdTable, from string) []problem {
	var problems []problem
	documented := map[string]int{} // variable -> line
	for _, tb := range tablesHeaded(tables, "variable") {
		if len(tb.header) < 2 || !strings.EqualFold(tb.header[1], "default") {
			problems = append(problems, problem{malformed, 0, fmt.Sprintf("a variable table under %q has no default column", tb.heading)})
			continue
		}
		for _, r := range tb.rows {
			if len(r.cells) < 2 {
				problems = append(problems, problem{malformed, r.line, "a row without a default cell"})
				continue
			}
			names, err := rowVariables(r.cells[0])
			if err != nil {
				problems = append(problems, problem{malformed, r.line, err.Error()})
				continue
			}
			defaults := codeSpans(r.cells[1])
			for i, name := range names {
				if l, ok := documented[name]; ok {
					problems = append(problems, problem{malformed, r.line, fmt.Sprintf("%s has a row already, line %d", name, l)})
				}
				documented[name] = r.line
				want, ok := vars[name]
				if !ok {
					problems = append(problems, problem{extra, r.line, name + " is documented, but " + from + " does not read it"})
					continue
				}
				if msg := checkDefault(want, defaults, i, len(names), from); msg != "" {
					problems = append(problems, problem{mismatch, r.line, name + ": " + msg})
				}
			}
		}
	}
	for name, def := range sortedKeys(vars) {
		if _, ok := documented[name]; !ok {
			shown := "no default"
			if def != "" {
				shown = "default `" + def + "`"
			}
			problems = append(problems, problem{missing, 0, fmt.Sprintf("%s (%s) is read by %s but has no row in a variable table", name, shown, from)})
		}
	}
	return problems
}

// checkDefault compares a variable's default in the code with the code spans of its row's
// default cell: the i-th of them when the row gives one per variable, else any of them. A
// cell in words, without a code span, stands for a zero default whose meaning it says
// ("the hostname", "per stream"); it cannot stand for a default the code spells out.
func checkDefault(want string, cell []string, i, vars int, from string) string {
	zero := want == "" || isZero(want)
	switch {
	case len(cell) == 0 && zero:
		return ""
	case len(cell) == 0:
		return fmt.Sprintf("%s gives the default `%s`, the table none", from, want)
	case len(cell) == vars:
		if sameValue(cell[i], want) {
			return ""
		}
		if want == "" {
			return fmt.Sprintf("%s gives no default, the table says `%s`", from, cell[i])
		}
		return fmt.Sprintf("%s gives the default `%s`, the table says `%s`", from, want, cell[i])
	}
	for _, c := range cell {
		if sameValue(c, want) {
			return ""
		}
	}
	if zero {
		return ""
	}
	return fmt.Sprintf("%s gives the default `%s`, the table shows %s", from, want, strings.Join(cell, ", "))
}

func isZero(v string) bool {
	if d, err := time.ParseDuration(v); err == nil {
		return d == 0
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return f == 0
	}
	return false
}

// sameValue: equal as text, as durations (600s and 10m) or as numbers.
func sameValue(a, b string) bool {
	if a == b {
		return true
	}
	if da, err := time.ParseDuration(a); err == nil {
		db, err := time.ParseDuration(b)
		return err == nil && da == db
	}
	fa, errA := strconv.ParseFloat(a, 64)
	fb, errB := strconv.ParseFloat(b, 64)
	return errA == nil && errB == nil && fa == fb
}

// compareMetrics returns what the `metric` tables get wrong against metrics (name -> where
// the code defines it): a metric without a row, and a row for a metric the code lacks.
func compareMetrics(metrics map[string]string, tables []mdTable) []problem {
	var problems []problem
	documented := map[string]int{}
	for _, tb := range tablesHeaded(tables, "metric") {
		for _, r := range tb.rows {
			spans := codeSpans(r.cells[0])
			if len(spans) == 0 {
				problems = append(problems, problem{malformed, r.line, fmt.Sprintf("no metric in %q", r.cells[0])})
			}
			for _, s := range spans {
				name, _, _ := strings.Cut(s, "{")
				if !metricName.MatchString(name) {
					problems = append(problems, problem{malformed, r.line, fmt.Sprintf("%q is not a metric's name", s)})
					continue
				}
				if l, ok := documented[name]; ok {
					problems = append(problems, problem{malformed, r.line, fmt.Sprintf("%s has a row already, line %d", name, l)})
				}
				documented[name] = r.line
				if _, ok := metrics[name]; !ok {
					problems = append(problems, problem{extra, r.line, name + " is documented, but the code defines no such metric"})
				}
			}
		}
	}
	for name, at := range sortedKeys(metrics) {
		if _, ok := documented[name]; !ok {
			problems = append(problems, problem{missing, 0, fmt.Sprintf("%s (defined at %s) has no row in a metric table", name, at)})
		}
	}
	return problems
}

// sortedKeys iterates over m in key order, so that failures read the same on every run.
func sortedKeys(m map[string]string) func(func(string, string) bool) {
	return func(yield func(string, string) bool) {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !yield(k, m[k]) {
				return
			}
		}
	}
}

func rel(path string) string {
	r, err := filepath.Rel(repoRoot, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

// composeKnob matches a variable compose.yaml reads from the shell: ${NAME}, ${NAME:-default}
// or ${NAME-default}.
var composeKnob = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:?-([^}]*))?\}`)

// TestComposeKnobDefaults checks deploy/README.md's table of the knobs compose.yaml reads:
// one row for each, with the default compose.yaml gives it, and none for a knob it does not
// read; a knob given two defaults in the file is an error.
func TestComposeKnobDefaults(t *testing.T) {
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	knobs := map[string]string{}
	for _, m := range composeKnob.FindAllStringSubmatch(string(raw), -1) {
		name, def := m[1], m[3]
		if prev, ok := knobs[name]; ok && prev != def {
			t.Errorf("compose.yaml gives %s two defaults: %q and %q", name, prev, def)
		}
		knobs[name] = def
	}
	if len(knobs) < 10 {
		t.Fatalf("only %d knobs found in compose.yaml", len(knobs))
	}
	var withDefaults []mdTable
	for _, tb := range tablesHeaded(readTables(t, "README.md"), "variable") {
		if len(tb.header) > 1 && strings.EqualFold(tb.header[1], "default") {
			withDefaults = append(withDefaults, tb)
		}
	}
	for _, p := range compareVariables(knobs, withDefaults, "compose.yaml") {
		t.Errorf("deploy/README.md: %s", p)
	}
}

// TestCompareReference runs the comparison on a small README: each kind of difference is
// found, and what is right passes.
func TestCompareReference(t *testing.T) {
	md := strings.Join([]string{
		"# svc",
		"| variable | default | meaning |",
		"|---|---|---|",
		"| `A_ADDR` | `127.0.0.1:1` | right |",
		"| `A_WAIT`, `A_IDLE` | `10m`, `1h` | right: 600s is 10m |",
		"| `A_SYN_GPUS`, `_SEED` | `2`, `1` | a suffix |",
		"| `A_HOST` | the hostname | words for an empty default |",
		"| `A_GONE` | | not read |",
		"| `A_BAD` | `5` | wrong default |",
		"| `A_TLS_*` | | a wildcard |",
		"| `A_ADDR` | `127.0.0.1:1` | twice |",
		"",
		"```",
		"| variable | default |",
		"|---|---|",
		"| `IN_CODE_BLOCK` | |",
		"```",
		"| metric | meaning |",
		"|---|---|",
		"| `a_total{code}`, `a_up` | counts \\| gauges |",
		"| `a_gone_total` | not defined |",
		"| `DCGM_FI_X` | another's name |",
	}, "\n")
	tables := parseTables(md)
	vars := map[string]string{"A_ADDR": "127.0.0.1:1", "A_WAIT": "600s", "A_IDLE": "1h", "A_SYN_GPUS": "2", "A_SYN_SEED": "1",
		"A_HOST": "", "A_BAD": "3", "A_MISSING": "7", "A_TLS_CA": ""}
	metrics := map[string]string{"a_total": "x.go:1", "a_up": "x.go:2", "a_missing_total": "x.go:3", "DCGM_FI_X": "x.go:4"}
	var got []string
	for _, p := range append(compareVariables(vars, tables, "the code"), compareMetrics(metrics, tables)...) {
		got = append(got, p.String())
	}
	want := []string{
		"line 8: A_GONE is documented, but the code does not read it",
		"line 9: A_BAD: the code gives the default `3`, the table says `5`",
		`line 10: "A_TLS_*" is not a variable's name (list every variable, without wildcards)`,
		"line 11: A_ADDR has a row already, line 4",
		"A_MISSING (default `7`) is read by the code but has no row in a variable table",
		"A_TLS_CA (no default) is read by the code but has no row in a variable table",
		"line 21: a_gone_total is documented, but the code defines no such metric",
		"a_missing_total (defined at x.go:3) has no row in a metric table",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if cells := tables[1].rows[0].cells; len(cells) != 2 || cells[1] != "counts | gauges" {
		t.Errorf("cells %q: an escaped pipe splits no cell", cells)
	}
}

func TestCheckDefault(t *testing.T) {
	f := func(want string, cell []string, i, vars int, ok bool) {
		t.Helper()
		if msg := checkDefault(want, cell, i, vars, "the code"); (msg == "") != ok {
			t.Errorf("checkDefault(%q, %q, %d, %d) = %q, want ok %v", want, cell, i, vars, msg, ok)
		}
	}
	f("5s", []string{"5s"}, 0, 1, true)
	f("600s", []string{"10m"}, 0, 1, true)
	f("1073741824", []string{"1073741824"}, 0, 1, true)
	f("5s", []string{"6s"}, 0, 1, false)
	f("5s", nil, 0, 1, false)         // a default the code spells out, shown in words only
	f("", nil, 0, 1, true)            // words for an empty default
	f("0s", nil, 0, 1, true)          // words for a zero default ("per stream")
	f("", []string{"x"}, 0, 1, false) // a default the code does not have
	f("b", []string{"a", "b"}, 1, 2, true)
	f("a", []string{"a", "b"}, 1, 2, false) // positional: the second variable's is b
	f("default", []string{"default"}, 0, 2, true)
	f("", []string{"default"}, 1, 2, true) // one default given for two variables: the other has none
}

// TestComposeOverrideExample loads compose.yaml with the override deploy/README.md shows, as
// docker compose -f compose.yaml -f compose.override.yaml would, and checks that every
// variable it sets is one its service reads.
func TestComposeOverrideExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "compose.override.yaml")
	if !ok {
		t.Fatal("deploy/README.md shows no compose.override.yaml")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	example, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no yaml block after compose.override.yaml in deploy/README.md")
	}
	dir := t.TempDir()
	override := filepath.Join(dir, "compose.override.yaml")
	if err := os.WriteFile(override, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	details := types.ConfigDetails{WorkingDir: filepath.Dir(abs),
		ConfigFiles: []types.ConfigFile{{Filename: abs}, {Filename: override}}}
	p, err := loader.LoadWithContext(context.Background(), details, loader.WithProfiles([]string{"*"}))
	if err != nil {
		t.Fatalf("docker compose would not load compose.yaml with the README's override: %v", err)
	}
	src := srcconfig.NewReader(repoRoot)
	set := 0
	for name, s := range p.Services {
		svc := tokenscopeService(s)
		if svc == "" || !strings.Contains(example, "\n  "+name+":") {
			continue
		}
		known := envVars(t, src, svc)
		for k := range s.Environment {
			if !strings.Contains(example, k+":") {
				continue
			}
			set++
			if _, ok := known[k]; !ok {
				t.Errorf("the README's override sets %s on %s, which services/%s does not read", k, name, svc)
			}
		}
	}
	if set == 0 {
		t.Fatal("the README's override sets no variable of a tokenscope service")
	}
}

// TestComposeStopGrace: docker compose stop waits stop_grace_period (10s unless set) before
// it kills a container; the emitter's must exceed EMITTER_SHUTDOWN_GRACE, its value in the
// compose file or the code's default, and the publisher's 5s flush after it, and each
// other service's the shutdown steps fixed in its code.
func TestComposeStopGrace(t *testing.T) {
	p := loadCompose(t, nil)
	vars := envVars(t, srcconfig.NewReader(repoRoot), "emitter")
	s := p.Services["emitter"]
	grace := vars["EMITTER_SHUTDOWN_GRACE"]
	if v := s.Environment["EMITTER_SHUTDOWN_GRACE"]; v != nil {
		grace = *v
	}
	d, err := time.ParseDuration(grace)
	if err != nil {
		t.Fatalf("EMITTER_SHUTDOWN_GRACE=%q: %v", grace, err)
	}
	stop := 10 * time.Second
	if s.StopGracePeriod != nil {
		stop = time.Duration(*s.StopGracePeriod)
	}
	// A process that takes all of its steps needs a moment more to exit: the grace must be
	// longer than their sum, not equal to it.
	if want := d + 5*time.Second; stop <= want {
		t.Errorf("emitter: stop_grace_period %s, want more than %s (EMITTER_SHUTDOWN_GRACE %s + the publisher's 5s)", stop, want, d)
	}

	// The others' shutdown steps are fixed in their code.
	steps := map[string]time.Duration{
		"tokenscope/gpuwatch": 15 * time.Second, // HTTP beside the publisher's flush (5s), then draining NATS (5s)
		"tokenscope/alerter":  15 * time.Second, // the window being delivered (10s), then draining NATS (5s)
		"fakellm":             10 * time.Second, // open requests (5s), then exporting the last spans (5s)
	}
	checked := 0
	for name, svc := range p.Services {
		image, _, _ := strings.Cut(svc.Image, ":")
		if len(svc.Command) > 0 {
			image = svc.Command[0] // an emitter subcommand
		}
		want, ok := steps[image]
		if !ok {
			continue
		}
		checked++
		stop := 10 * time.Second
		if svc.StopGracePeriod != nil {
			stop = time.Duration(*svc.StopGracePeriod)
		}
		if stop <= want {
			t.Errorf("%s: stop_grace_period %s, want more than %s", name, stop, want)
		}
	}
	if checked < 5 {
		t.Errorf("%d gpuwatch, alerter and fakellm services found in compose.yaml, want 5", checked)
	}
}
