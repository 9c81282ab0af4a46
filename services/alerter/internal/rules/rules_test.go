package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEngineLevelWindows(t *testing.T) {
	f := func(d time.Duration, window, want int) {
		t.Helper()
		if got := (EngineLevel{For: d}).Windows(window); got != want {
			t.Errorf("for %s in %d s windows = %d, want %d", d, window, got, want)
		}
	}
	f(2*time.Minute, 15, 8)
	f(2*time.Minute, 7, 18)
	f(0, 15, 1)
	f(30*time.Second, 60, 1)
	f(time.Minute, 0, 1)
}

func TestDefaults(t *testing.T) {
	d := Defaults()
	if d.For != 2 || d.KeepFiringFor < 1 {
		t.Errorf("for %d keep_firing_for %d, want 2 and ≥ 1", d.For, d.KeepFiringFor)
	}
	for m := Metric(0); m < NumMetrics; m++ {
		if dy := d.Dynamic[m]; !dy.Enabled || dy.K != 2 || dy.Method != MedianMAD || dy.MinPoints < 1 {
			t.Errorf("%s: dynamic %+v, want enabled, k = 2, median_mad", m, dy)
		}
	}
	// The built-in SLA thresholds.
	if s := d.Static[TTFTP95]; s.Warning != 2000 || s.Critical != 5000 {
		t.Errorf("ttft_p95 SLA %+v, want 2000/5000 ms", s)
	}
	if s := d.Static[TPOTP95]; s.Warning != 100 || s.Critical != 200 {
		t.Errorf("tpot_p95 SLA %+v, want 100/200 ms", s)
	}
	if !d.Static[TimeoutRate].Enabled || !d.Static[ErrorRate].Enabled {
		t.Error("error and timeout rate SLAs must be on, separately")
	}
	e := d.Engine
	if !e.KVCache.Enabled || e.KVCache.Threshold != 0.95 || e.KVCache.For != 2*time.Minute || !e.Preemptions.Enabled ||
		!e.Down.Enabled || e.Down.Severity != "critical" || !e.TTFTHint {
		t.Errorf("engine rules %+v, want KV ≥ 95 %% for 2m, preemptions, down critical, the TTFT hint", e)
	}
	if !d.Dynamic[QueueDepth].Enabled || !d.Dynamic[QueueTimeP95].Enabled || !QueueTimeP95.HighIsBad() || !QueueDepth.EngineMetric() || QueueDepth.HostMetric() {
		t.Error("queue depth and queue time must be dynamic engine rules, high is bad")
	}
	if d.Saturation.UtilPct != 95 {
		t.Errorf("saturation at %v %%, want 95", d.Saturation.UtilPct)
	}
}

func TestLoadFile(t *testing.T) {
	s, err := Load(filepath.Join("testdata", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Default.For != 3 || s.Default.KeepFiringFor != 4 {
		t.Errorf("defaults for %d keep %d, want 3 and 4", s.Default.For, s.Default.KeepFiringFor)
	}
	if d := s.Default.Dynamic[TTFTP95]; d.Method != MedianMAD || d.K != 3 || d.MinChange != 0.3 {
		t.Errorf("default ttft dynamic %+v, want median_mad k 3 and the built-in min_change", d)
	}
	if s.Default.Dynamic[GPUEfficiency].Enabled {
		t.Error("gpu_efficiency should be disabled")
	}
	if s.Default.Saturation.UtilPct != 97 || s.Default.Saturation.Severity != "critical" {
		t.Errorf("saturation %+v", s.Default.Saturation)
	}
	if e := s.Default.Engine; e.KVCache.Threshold != 0.9 || e.KVCache.For != time.Minute || e.KVCache.Severity != "warning" ||
		e.Preemptions.Threshold != 0.5 || e.Preemptions.For != 2*time.Minute || e.Preemptions.Severity != "critical" ||
		e.Down.Enabled || !e.TTFTHint {
		t.Errorf("engine rules %+v", e)
	}
	cs := s.For("customer-service")
	if cs.Static[TTFTP95].Warning != 1000 || cs.Static[TTFTP95].Critical != 3000 {
		t.Errorf("customer-service ttft SLA %+v", cs.Static[TTFTP95])
	}
	if cs.For != 3 || cs.Dynamic[TTFTP95].Method != MedianMAD {
		t.Error("a scene must inherit the file's defaults")
	}
	if cs.Dynamic[ErrorRate].MinDelta != 0.01 || cs.Dynamic[ErrorRate].Severity != "critical" {
		t.Errorf("customer-service error rate %+v", cs.Dynamic[ErrorRate])
	}
	if other := s.For("chat"); other.Static[TTFTP95].Warning != 2000 {
		t.Errorf("an unlisted scene gets the defaults, got %+v", other.Static[TTFTP95])
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unknown metric", "defaults:\n  dynamic:\n    ttft_p50: {k: 2}\n", "defaults.dynamic.ttft_p50: unknown metric"},
		{"negative k", "scenes:\n  chat:\n    dynamic:\n      ttft_p95: {k: -1}\n", "scenes.chat.dynamic.ttft_p95.k: must be positive"},
		{"bad method", "defaults:\n  dynamic:\n    tpot_p95: {method: p99}\n", "defaults.dynamic.tpot_p95.method"},
		{"bad severity", "defaults:\n  dynamic:\n    tpot_p95: {severity: page}\n", "defaults.dynamic.tpot_p95.severity"},
		{"critical below warning", "scenes:\n  chat:\n    static:\n      ttft_p95: {warning: 3000, critical: 1000}\n", "scenes.chat.static.ttft_p95.critical"},
		{"rate above 1", "defaults:\n  static:\n    error_rate: {warning: 5}\n", "defaults.static.error_rate.warning"},
		{"no static rule", "defaults:\n  static:\n    output_tps: {warning: 5}\n", "defaults.static.output_tps: no static rule"},
		{"host rule per scene", "scenes:\n  chat:\n    dynamic:\n      gpu_efficiency: {k: 3}\n", "scenes.chat.dynamic.gpu_efficiency: is a per-host rule"},
		{"saturation per scene", "scenes:\n  chat:\n    saturation: {util_pct: 90}\n", "scenes.chat.saturation"},
		{"for zero", "defaults:\n  for: 0\n", "defaults.for"},
		// yaml.v3 alone reads 2.9 into an int as 2: a fractional count is an error, not truncated.
		{"fractional for", "defaults:\n  for: 2.9\n", "line 2 (defaults.for): cannot unmarshal !!float `2.9` into a whole number"},
		{"fractional keep_firing_for", "defaults:\n  keep_firing_for: 0.5\n", "line 2 (defaults.keep_firing_for): cannot unmarshal !!float `0.5` into a whole number"},
		{"fractional min_points", "defaults:\n  dynamic:\n    ttft_p95: {min_points: 59.5}\n", "line 3 (defaults.dynamic.ttft_p95.min_points): cannot unmarshal !!float `59.5` into a whole number"},
		{"fractional min_requests", "scenes:\n  chat:\n    static:\n      error_rate: {min_requests: 99.9}\n", "line 4 (scenes.chat.static.error_rate.min_requests): cannot unmarshal !!float `99.9` into a whole number"},
		{"text for", "defaults:\n  for: two\n", "line 2 (defaults.for): cannot unmarshal !!str `two` into a whole number"},
		{"duplicate metric", "defaults:\n  dynamic:\n    ttft_p95: {k: 2}\n    ttft_p95: {k: 3}\n", "line 4 (defaults.dynamic.ttft_p95): mapping key \"ttft_p95\" already defined"},
		{"unknown field", "defaults:\n  dynamic:\n    ttft_p95: {kk: 2}\n", "line 3 (defaults.dynamic.ttft_p95.kk): field kk is unknown (want enabled, method, k,"},
		{"unknown engine field", "defaults:\n  engine:\n    down:\n      after: 30s\n", "line 4 (defaults.engine.down.after): field after is unknown (want enabled, usage, per_s, for or severity)"},
		{"unknown section", "default:\n  for: 2\n", "line 1 (default): field default is unknown (want defaults or scenes)"},
		{"list for a section", "defaults: [1]\n", "line 1 (defaults): cannot unmarshal !!seq into a map"},
		{"two errors on one line", "defaults:\n  for: 2.5\n  hysteresis: x\n", "line 2 (defaults.for): cannot unmarshal !!float `2.5` into a whole number; line 3 (defaults.hysteresis): cannot unmarshal !!str `x` into a number"},
		// The path names the key the error is about, also among others on its line or when
		// the value is on a line of its own. It named the line's first key.
		{"unknown field among others on its line", "defaults:\n  dynamic:\n    ttft_p95: {k: 3, kk: 1}\n", "line 3 (defaults.dynamic.ttft_p95.kk): field kk is unknown"},
		{"bad value among others on its line", "defaults:\n  dynamic:\n    ttft_p95: {min_points: 3, k: abc}\n", "line 3 (defaults.dynamic.ttft_p95.k): cannot unmarshal !!str `abc` into a number"},
		{"bad value on a line of its own", "defaults:\n  hysteresis:\n    x\n", "line 3 (defaults.hysteresis): cannot unmarshal !!str `x` into a number"},
		{"duplicate key with a quote", "scenes:\n  'a\"b': {}\n  'a\"b': {}\n", `line 3 (scenes.a"b): mapping key "a\"b" already defined at line 2`},
		// One line: a key or value holding a line break is written with \n. It broke the line.
		{"key with a line break", "defaults:\n  \"a\\nb\": 1\n", `line 2 (defaults.a\nb): field a\nb is unknown`},
		{"value with a line break", "defaults:\n  for: \"1\\n2\"\n", "line 2 (defaults.for): cannot unmarshal !!str `1\\n2` into a whole number"},
		{"not yaml", "defaults: [", "invalid rules"},
		{"second document", "defaults:\n  for: 2\n---\nscenes:\n  chat:\n    static:\n      ttft_p95: {warning: 1000}\n", "a second YAML document at line 3"},
		{"bad second document", "defaults:\n  for: 2\n---\nscenes: [\n", "invalid rules"},
		{"util above 100", "defaults:\n  saturation: {util_pct: 120}\n", "defaults.saturation.util_pct"},
		{"engine metric per scene", "scenes:\n  chat:\n    dynamic:\n      queue_depth: {k: 3}\n", "scenes.chat.dynamic.queue_depth: is a per-engine rule"},
		{"engine rules per scene", "scenes:\n  chat:\n    engine:\n      ttft_hint: false\n", "scenes.chat.engine: is a per-engine rule"},
		{"kv usage above 1", "defaults:\n  engine:\n    kv_cache: {usage: 95}\n", "defaults.engine.kv_cache.usage: must be a fraction"},
		{"per_s on kv", "defaults:\n  engine:\n    kv_cache: {per_s: 1}\n", "defaults.engine.kv_cache.per_s: only preemptions"},
		{"negative per_s", "defaults:\n  engine:\n    preemptions: {per_s: -1}\n", "defaults.engine.preemptions.per_s"},
		{"bad for", "defaults:\n  engine:\n    down: {for: soon}\n", "invalid rules"},
		{"negative for", "defaults:\n  engine:\n    down: {for: -1m}\n", "defaults.engine.down.for"},
		{"engine severity", "defaults:\n  engine:\n    down: {severity: page}\n", "defaults.engine.down.severity"},
		// yaml.v3 drops an entry whose key is null without a word, KnownFields or not: a
		// scene written null: got no rules, and a setting under ~ was not read.
		{"null scene", "scenes:\n  null:\n    static:\n      ttft_p95: {warning: 100}\n", "line 2 (scenes): a key is null"},
		{"tilde scene", "scenes:\n  chat: {}\n  ~: {for: 7}\n", "line 3 (scenes): a key is null"},
		{"null field", "defaults:\n  dynamic:\n    ttft_p95:\n      ~: 3\n", "line 4 (defaults.dynamic.ttft_p95): a key is null"},
		{"null metric", "defaults:\n  static:\n    Null: {warning: 3}\n", "line 3 (defaults.static): a key is null"},
		{"null section", "~:\n  for: 3\n", "line 1: a key is null"},
		{"no floor under the median", "defaults:\n  dynamic:\n    error_rate: {min_change: 0, min_delta: 0}\n", "defaults.dynamic.error_rate.min_delta: min_change and min_delta are both 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if !errors.Is(err, ErrInvalidRules) {
				t.Fatalf("err = %v, want ErrInvalidRules", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %q, want it to name %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "rules.file") {
				t.Errorf("err = %q, want one line naming no Go type", err)
			}
		})
	}
}

// TestParseDocuments: a "---" at the start or end is harmless, and a second document with
// rules in it is an error rather than rules silently not applied.
func TestParseDocuments(t *testing.T) {
	for _, y := range []string{"---\ndefaults:\n  for: 3\n", "defaults:\n  for: 3\n---\n", "defaults:\n  for: 3\n---\n# nothing\n---\n", "defaults:\n  for: 3\n...\n"} {
		s, err := Parse([]byte(y))
		if err != nil || s.Default.For != 3 {
			t.Errorf("%q: %v, want for 3", y, err)
		}
	}
	if _, err := Parse([]byte("defaults:\n  for: 3\n---\n---\ndefaults:\n  for: 5\n")); !errors.Is(err, ErrInvalidRules) {
		t.Errorf("a second document with rules: %v, want ErrInvalidRules", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "none.yaml"))
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "ALERTER_RULES") {
		t.Errorf("err = %v, want a not-exist error naming ALERTER_RULES", err)
	}
	s, err := Load("")
	if err != nil || s.Source != "built-in" {
		t.Errorf("no file: %v, %v; want the built-in rules", s, err)
	}
}

// TestBusinessRules checks the business metrics: low is bad, per scene in the rules file,
// with a minimum count of verdicts or outcomes, and no static rule.
func TestBusinessRules(t *testing.T) {
	d := Defaults()
	for _, m := range []Metric{Satisfaction, CompletionRate} {
		if m.HighIsBad() || m.HostMetric() || !m.BusinessMetric() {
			t.Errorf("%s: high is bad %v, host %v, business %v", m, m.HighIsBad(), m.HostMetric(), m.BusinessMetric())
		}
		if dy := d.Dynamic[m]; dy.MinRequests != 20 || dy.MinDelta != 0.1 || dy.MinPoints != 30 {
			t.Errorf("%s: dynamic %+v, want min_requests 20, min_delta 0.1, min_points 30", m, dy)
		}
	}
	if TokensPerJoule.BusinessMetric() || !TokensPerJoule.HostMetric() {
		t.Error("tokens_per_joule is a host metric")
	}
	s, err := Parse([]byte("defaults:\n  dynamic:\n    completion_rate: {min_requests: 50}\nscenes:\n  support:\n    dynamic:\n      satisfaction: {min_requests: 5, k: 3, severity: critical}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if sat := s.For("support").Dynamic[Satisfaction]; sat.MinRequests != 5 || sat.K != 3 || sat.Severity != "critical" {
		t.Errorf("support satisfaction %+v", sat)
	}
	if c := s.For("support").Dynamic[CompletionRate]; c.MinRequests != 50 {
		t.Errorf("support completion %+v, want the file's default min_requests 50", c)
	}
	if _, err := Parse([]byte("defaults:\n  static:\n    satisfaction: {warning: 0.5}\n")); !errors.Is(err, ErrInvalidRules) {
		t.Errorf("a static satisfaction rule: %v, want invalid", err)
	}
}

// TestWholeNumbers: counts are whole numbers, written as such or as 3.0.
func TestWholeNumbers(t *testing.T) {
	s, err := Parse([]byte("defaults:\n  for: 3.0\n  keep_firing_for: 4\n  dynamic:\n    ttft_p95: {min_points: 30, min_requests: 50}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := s.Default; d.For != 3 || d.KeepFiringFor != 4 || d.Dynamic[TTFTP95].MinPoints != 30 || d.Dynamic[TTFTP95].MinRequests != 50 {
		t.Errorf("for %d keep_firing_for %d dynamic %+v", d.For, d.KeepFiringFor, d.Dynamic[TTFTP95])
	}
}

// A file that names a method keeps it: mean_sigma stays selectable, in the defaults or per
// scene, and a metric or scene that names none gets the built-in median_mad.
// TestNoFloorUnderMeanSigma: mean ± k·σ with neither floor is allowed (σ is 0 only on a
// series flat in every window), the median's is refused (MAD is 0 on one flat in most).
func TestNoFloorUnderMeanSigma(t *testing.T) {
	if _, err := Parse([]byte("defaults:\n  dynamic:\n    error_rate: {method: mean_sigma, min_change: 0, min_delta: 0}\n")); err != nil {
		t.Fatal(err)
	}
}

func TestMethodNamedInFileIsKept(t *testing.T) {
	s, err := Parse([]byte("defaults:\n  dynamic:\n    ttft_p95: {method: mean_sigma}\nscenes:\n  chat:\n    dynamic:\n      error_rate: {method: mean_sigma}\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := func(r *Rules, m Metric, want string) {
		t.Helper()
		if got := r.Dynamic[m].Method; got != want {
			t.Errorf("%s: method %s, want %s", m, got, want)
		}
	}
	f(&s.Default, TTFTP95, MeanSigma)
	f(&s.Default, TPOTP95, MedianMAD)
	f(&s.Default, ErrorRate, MedianMAD)
	f(s.For("chat"), TTFTP95, MeanSigma) // inherited from the file's defaults
	f(s.For("chat"), ErrorRate, MeanSigma)
	f(s.For("chat"), TimeoutRate, MedianMAD)
	f(s.For("search"), ErrorRate, MedianMAD)
}

// TestParseErrorsBounded: a file with thousands of errors (a generated or mangled file)
// gets a message of its first errors and a count of the rest, one line of a log. It listed
// every one, each found again in the whole file: 16,000 unknown keys took 17 s and made a
// 2.5 MB line.
func TestParseErrorsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("defaults:\n  dynamic:\n    ttft_p95:\n")
	for i := range 5000 {
		fmt.Fprintf(&b, "      x%d: 1\n", i)
	}
	_, err := Parse([]byte(b.String()))
	if !errors.Is(err, ErrInvalidRules) {
		t.Fatalf("err = %v, want ErrInvalidRules", err)
	}
	msg := err.Error()
	if n := strings.Count(msg, "is unknown"); n != maxYAMLErrors || len(msg) > 4096 ||
		!strings.HasPrefix(msg, "invalid rules: line 4 (defaults.dynamic.ttft_p95.x0): field x0 is unknown") ||
		!strings.HasSuffix(msg, fmt.Sprintf("; and %d more", 5000-maxYAMLErrors)) {
		t.Errorf("err (%d bytes) lists %d errors: %.300s … %s", len(msg), n, msg, msg[max(len(msg)-100, 0):])
	}
}

// TestQuotedNullScene: a scene named null, quoted, is a scene like any other.
func TestQuotedNullScene(t *testing.T) {
	s, err := Parse([]byte("scenes:\n  'null': {for: 7}\n  \"~\": {for: 8}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.For("null").For != 7 || s.For("~").For != 8 {
		t.Errorf("scenes %v, want null with for 7 and ~ with for 8", s.Scenes)
	}
}
