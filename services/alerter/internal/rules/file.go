package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrInvalidRules is wrapped by every error that rejects a rules file.
var ErrInvalidRules = errors.New("invalid rules")

// The rules file: every field is optional and overrides the built-in default; a scene's
// section overrides the file's defaults for that scene.
//
//	defaults:
//	  for: 2
//	  keep_firing_for: 2
//	  dynamic:
//	    ttft_p95: {k: 2, method: median_mad, min_points: 60, min_requests: 20}
//	  static:
//	    ttft_p95: {warning: 2000, critical: 5000}
//	  saturation: {util_pct: 95}
//	  engine:
//	    kv_cache: {usage: 0.95, for: 2m}
//	    preemptions: {per_s: 0, for: 2m}
//	    down: {for: 30s, severity: critical}
//	    ttft_hint: true
//	scenes:
//	  customer-service:
//	    static:
//	      ttft_p95: {warning: 1000, critical: 3000}
type fileRules struct {
	Defaults *fileSection            `yaml:"defaults"`
	Scenes   map[string]*fileSection `yaml:"scenes"`
}

type fileSection struct {
	For           *count                  `yaml:"for"`
	KeepFiringFor *count                  `yaml:"keep_firing_for"`
	Hysteresis    *float64                `yaml:"hysteresis"`
	Dynamic       map[string]*fileDynamic `yaml:"dynamic"`
	Static        map[string]*fileStatic  `yaml:"static"`
	Saturation    *fileSaturation         `yaml:"saturation"`
	Engine        *fileEngine             `yaml:"engine"`
}

type fileEngine struct {
	KVCache     *fileEngineLevel `yaml:"kv_cache"`
	Preemptions *fileEngineLevel `yaml:"preemptions"`
	Down        *fileEngineLevel `yaml:"down"`
	TTFTHint    *bool            `yaml:"ttft_hint"`
}

// fileEngineLevel is one engine rule; its threshold is usage (kv_cache) or per_s
// (preemptions), down has none.
type fileEngineLevel struct {
	Enabled  *bool          `yaml:"enabled"`
	Usage    *float64       `yaml:"usage"`
	PerS     *float64       `yaml:"per_s"`
	For      *time.Duration `yaml:"for"`
	Severity *string        `yaml:"severity"`
}

type fileDynamic struct {
	Enabled     *bool    `yaml:"enabled"`
	Method      *string  `yaml:"method"`
	K           *float64 `yaml:"k"`
	Severity    *string  `yaml:"severity"`
	MinChange   *float64 `yaml:"min_change"`
	MinDelta    *float64 `yaml:"min_delta"`
	MinPoints   *count   `yaml:"min_points"`
	MinRequests *count   `yaml:"min_requests"`
}

type fileStatic struct {
	Enabled     *bool    `yaml:"enabled"`
	Warning     *float64 `yaml:"warning"`
	Critical    *float64 `yaml:"critical"`
	MinRequests *count   `yaml:"min_requests"`
	Always      *bool    `yaml:"always"`
}

// count is a number of windows or requests in the rules file: a whole number. yaml.v3
// decodes 2.9 into an int as 2, so `for: 2.9` would silently mean 2 and `for: 0.5` be
// reported as 0.
type count int64

func (c *count) UnmarshalYAML(n *yaml.Node) error {
	var f float64
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") && n.Decode(&f) == nil &&
		f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
		*c = count(f)
		return nil
	}
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s `%s` into a whole number", n.Line, n.ShortTag(), n.Value)}}
}

type fileSaturation struct {
	Enabled  *bool    `yaml:"enabled"`
	UtilPct  *float64 `yaml:"util_pct"`
	Severity *string  `yaml:"severity"`
}

// Load reads the rules file at path; an empty path returns the built-in defaults.
func Load(path string) (*Set, error) {
	if path == "" {
		return NewSet(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read rules file ALERTER_RULES=%s: %w", path, err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("rules file %s: %w", path, err)
	}
	s.Source = path
	return s, nil
}

// Parse parses a rules file's YAML. Unknown fields, metrics or scenes' host rules are
// errors naming the rule and field, such as "scenes.chat.dynamic.ttft_p95.k: must be
// positive (got -1)".
func Parse(data []byte) (*Set, error) {
	var f fileRules
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %s", ErrInvalidRules, yamlError(data, err))
	}
	// The rules are one document: another after a "---" would be read by no one. Empty
	// ones (a "---" at the end) hold nothing to lose.
	for {
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s", ErrInvalidRules, strings.TrimPrefix(err.Error(), "yaml: "))
		}
		if len(next.Content) > 0 && next.Content[0].Tag != "!!null" {
			return nil, fmt.Errorf("%w: a second YAML document at line %d: the rules are one document, without \"---\" between sections", ErrInvalidRules, next.Line)
		}
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err == nil { // it parsed once already
		if line, path, ok := nullKey(&root, nil); ok {
			if path != "" {
				path = " (" + path + ")"
			}
			return nil, fmt.Errorf("%w: line %d%s: a key is null (~, null or none): its entry would be ignored; quote a name such as 'null'", ErrInvalidRules, line, oneLine(path))
		}
	}
	s := NewSet()
	if f.Defaults != nil {
		if err := f.Defaults.apply(&s.Default, "defaults", false); err != nil {
			return nil, err
		}
	}
	names := make([]string, 0, len(f.Scenes))
	for name := range f.Scenes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "" {
			return nil, fmt.Errorf("%w: scenes: a scene name is empty", ErrInvalidRules)
		}
		r := s.Default // scenes start from the file's defaults
		if sec := f.Scenes[name]; sec != nil {
			if err := sec.apply(&r, "scenes."+name, true); err != nil {
				return nil, err
			}
		}
		s.Scenes[name] = &r
	}
	return s, nil
}

// nullKey returns the line and the key path of the first mapping key under n that is null
// (~, null or none), which yaml.v3 drops with its value without a word: a scene written
// null: would get no rules. Aliases are not followed: what they name is walked where it is
// defined.
func nullKey(n *yaml.Node, at []string) (int, string, bool) {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			if line, path, ok := nullKey(c, at); ok {
				return line, path, true
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!null" {
				return k.Line, strings.Join(at, "."), true
			}
			if line, path, ok := nullKey(v, append(at[:len(at):len(at)], k.Value)); ok {
				return line, path, true
			}
		}
	}
	return 0, "", false
}

// maxYAMLErrors is how many of yaml.v3's messages yamlError words; the rest are counted.
const maxYAMLErrors = 10

// yamlError words a decoding error for the file's author, on one line: each of yaml.v3's
// "line N: …" messages gets the key path it is at (defaults.dynamic.ttft_p95.kk), and the
// Go types the file is read into are named as what the file should hold. A line break in
// a key or value is written \n; past maxYAMLErrors messages, the rest are counted.
func yamlError(data []byte, err error) string {
	te, ok := errors.AsType[*yaml.TypeError](err)
	if !ok {
		return oneLine(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // it parsed once already; on error, no paths
	msgs := make([]string, 0, min(len(te.Errors), maxYAMLErrors+1))
	for i, m := range te.Errors {
		if i == maxYAMLErrors {
			msgs = append(msgs, fmt.Sprintf("and %d more", len(te.Errors)-i))
			break
		}
		var line int
		if _, err := fmt.Sscanf(m, "line %d:", &line); err == nil {
			if path := keyPath(&root, line, hintOf(m)); path != "" {
				m = strings.Replace(m, fmt.Sprintf("line %d:", line), fmt.Sprintf("line %d (%s):", line, path), 1)
			}
		}
		msgs = append(msgs, oneLine(goTypes.Replace(m)))
	}
	return strings.Join(msgs, "; ")
}

// oneLine writes the line breaks of keys and values quoted in a message as \n and \r.
func oneLine(m string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(m)
}

// pathHint is what one of yaml.v3's messages says of the node it is about: a key's name
// (a duplicate or unknown key), the value it could not read (truncated: a prefix), or
// that it could not read a map or list.
type pathHint struct {
	key, value                             string
	isKey, isValue, isPrefix, isCollection bool
}

func hintOf(m string) pathHint {
	if _, after, ok := strings.Cut(m, "mapping key "); ok { // %#v of the key
		if q, err := strconv.QuotedPrefix(after); err == nil {
			if k, err := strconv.Unquote(q); err == nil {
				return pathHint{key: k, isKey: true}
			}
		}
		return pathHint{}
	}
	if _, after, ok := strings.Cut(m, ": field "); ok {
		if i := strings.LastIndex(after, " not found in type "); i >= 0 {
			return pathHint{key: after[:i], isKey: true}
		}
	}
	if _, after, ok := strings.Cut(m, ": cannot unmarshal !!"); ok {
		if strings.HasPrefix(after, "map into ") || strings.HasPrefix(after, "seq into ") {
			return pathHint{isCollection: true}
		}
		if _, v, ok := strings.Cut(after, " `"); ok {
			if i := strings.LastIndex(v, "` into "); i >= 0 {
				v = v[:i]
				h := pathHint{value: v, isValue: true}
				if p, ok := strings.CutSuffix(v, "..."); ok {
					h.value, h.isPrefix = p, true
				}
				return h
			}
		}
	}
	return pathHint{}
}

// keyPath returns the dotted path of the key at line under n that h names ("" if none):
// the key of that name on the line, the key whose scalar value on the line is h's, or
// the key whose map or list starts on the line; without a hint, or when none matches, the deepest key on the line (a value on its own
// line: its key).
func keyPath(n *yaml.Node, line int, h pathHint) string {
	var match, deepest []string
	var walk func(n *yaml.Node, at []string)
	walk = func(n *yaml.Node, at []string) {
		if match != nil {
			return
		}
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for _, c := range n.Content {
				walk(c, at)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content) && match == nil; i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				path := append(at[:len(at):len(at)], k.Value)
				switch {
				case h.isKey && k.Line == line && k.Value == h.key,
					h.isValue && v.Kind == yaml.ScalarNode && v.Line == line &&
						(v.Value == h.value || h.isPrefix && strings.HasPrefix(v.Value, h.value)),
					h.isCollection && (v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode) && v.Line == line:
					match = path
					return
				}
				if (k.Line == line || v.Line == line) && len(path) > len(deepest) {
					deepest = path
				}
				walk(v, path)
			}
		}
	}
	walk(n, nil)
	if match == nil {
		match = deepest
	}
	return strings.Join(match, ".")
}

// goTypes names the types the rules file is decoded into as what the file should hold (a
// longer pattern before one it starts with: the first that matches is used).
var goTypes = strings.NewReplacer(
	"not found in type rules.fileRules", "is unknown (want defaults or scenes)",
	"not found in type rules.fileSection", "is unknown (want for, keep_firing_for, hysteresis, dynamic, static, saturation or engine)",
	"not found in type rules.fileDynamic", "is unknown (want enabled, method, k, severity, min_change, min_delta, min_points or min_requests)",
	"not found in type rules.fileStatic", "is unknown (want enabled, warning, critical, min_requests or always)",
	"not found in type rules.fileSaturation", "is unknown (want enabled, util_pct or severity)",
	"not found in type rules.fileEngineLevel", "is unknown (want enabled, usage, per_s, for or severity)",
	"not found in type rules.fileEngine", "is unknown (want kv_cache, preemptions, down or ttft_hint)",
	"into map[string]*rules.fileSection", "into a map of scenes",
	"into map[string]*rules.fileDynamic", "into a map of metrics",
	"into map[string]*rules.fileStatic", "into a map of metrics",
	"into rules.fileRules", "into a map",
	"into rules.fileSection", "into a map",
	"into rules.fileDynamic", "into a map",
	"into rules.fileStatic", "into a map",
	"into rules.fileSaturation", "into a map",
	"into rules.fileEngineLevel", "into a map",
	"into rules.fileEngine", "into a map",
	"into float64", "into a number",
	"into bool", "into true or false",
	"into string", "into text",
	"into time.Duration", "into a duration such as 2m",
)

func invalid(at, field, format string, args ...any) error {
	return fmt.Errorf("%w: %s.%s: %s", ErrInvalidRules, at, field, fmt.Sprintf(format, args...))
}

func (sec *fileSection) apply(r *Rules, at string, scene bool) error {
	if sec.For != nil {
		if *sec.For < 1 || *sec.For > 1000 {
			return invalid(at, "for", "must be 1 to 1000 windows (got %d)", *sec.For)
		}
		r.For = int(*sec.For)
	}
	if sec.KeepFiringFor != nil {
		if *sec.KeepFiringFor < 1 || *sec.KeepFiringFor > 1000 {
			return invalid(at, "keep_firing_for", "must be 1 to 1000 windows (got %d)", *sec.KeepFiringFor)
		}
		r.KeepFiringFor = int(*sec.KeepFiringFor)
	}
	if sec.Hysteresis != nil {
		if !(*sec.Hysteresis >= 0 && *sec.Hysteresis < 1) {
			return invalid(at, "hysteresis", "must be at least 0 and below 1 (got %v)", *sec.Hysteresis)
		}
		r.Hysteresis = *sec.Hysteresis
	}
	for _, name := range sortedKeys(sec.Dynamic) {
		m, ok := ParseMetric(name)
		if !ok {
			return invalid(at, "dynamic."+name, "unknown metric (want one of %s)", strings.Join(metricNames[:], ", "))
		}
		if scene && m.HostMetric() {
			return invalid(at, "dynamic."+name, "is a per-host rule: set it under defaults, not per scene")
		}
		if scene && m.EngineMetric() {
			return invalid(at, "dynamic."+name, "is a per-engine rule: set it under defaults, not per scene")
		}
		if d := sec.Dynamic[name]; d != nil {
			if err := d.apply(&r.Dynamic[m], at+".dynamic."+name); err != nil {
				return err
			}
		}
	}
	for _, name := range sortedKeys(sec.Static) {
		m, ok := ParseMetric(name)
		if !ok || Defaults().Static[m] == (StaticRule{}) {
			return invalid(at, "static."+name, "no static rule for this metric (want ttft_p95, tpot_p95, error_rate or timeout_rate)")
		}
		if st := sec.Static[name]; st != nil {
			if err := st.apply(&r.Static[m], at+".static."+name, m); err != nil {
				return err
			}
		}
	}
	if sat := sec.Saturation; sat != nil {
		if scene {
			return invalid(at, "saturation", "is a per-host rule: set it under defaults, not per scene")
		}
		if sat.Enabled != nil {
			r.Saturation.Enabled = *sat.Enabled
		}
		if sat.UtilPct != nil {
			if !(*sat.UtilPct > 0 && *sat.UtilPct <= 100) {
				return invalid(at, "saturation.util_pct", "must be above 0 and at most 100 (got %v)", *sat.UtilPct)
			}
			r.Saturation.UtilPct = *sat.UtilPct
		}
		if sat.Severity != nil {
			if err := checkSeverity(*sat.Severity); err != nil {
				return invalid(at, "saturation.severity", "%v", err)
			}
			r.Saturation.Severity = *sat.Severity
		}
	}
	if eng := sec.Engine; eng != nil {
		if scene {
			return invalid(at, "engine", "is a per-engine rule: set it under defaults, not per scene")
		}
		if err := eng.apply(&r.Engine, at+".engine"); err != nil {
			return err
		}
	}
	return nil
}

func (f *fileEngine) apply(r *EngineRules, at string) error {
	for _, l := range []struct {
		name      string
		file      *fileEngineLevel
		rule      *EngineLevel
		threshold string // the field that sets the threshold, "" for none
	}{
		{"kv_cache", f.KVCache, &r.KVCache, "usage"},
		{"preemptions", f.Preemptions, &r.Preemptions, "per_s"},
		{"down", f.Down, &r.Down, ""},
	} {
		if l.file != nil {
			if err := l.file.apply(l.rule, at+"."+l.name, l.threshold); err != nil {
				return err
			}
		}
	}
	if f.TTFTHint != nil {
		r.TTFTHint = *f.TTFTHint
	}
	return nil
}

func (f *fileEngineLevel) apply(r *EngineLevel, at, threshold string) error {
	if f.Enabled != nil {
		r.Enabled = *f.Enabled
	}
	if f.Usage != nil {
		if threshold != "usage" {
			return invalid(at, "usage", "only kv_cache takes usage")
		}
		if !(*f.Usage > 0 && *f.Usage <= 1) {
			return invalid(at, "usage", "must be a fraction above 0 and at most 1 (got %v)", *f.Usage)
		}
		r.Threshold = *f.Usage
	}
	if f.PerS != nil {
		if threshold != "per_s" {
			return invalid(at, "per_s", "only preemptions takes per_s")
		}
		if !(*f.PerS >= 0) || math.IsInf(*f.PerS, 0) {
			return invalid(at, "per_s", "must be a finite value of at least 0 (got %v)", *f.PerS)
		}
		r.Threshold = *f.PerS
	}
	if f.For != nil {
		if *f.For < 0 || *f.For > 24*time.Hour {
			return invalid(at, "for", "must be from 0 to 24h (got %s)", *f.For)
		}
		r.For = *f.For
	}
	if f.Severity != nil {
		if err := checkSeverity(*f.Severity); err != nil {
			return invalid(at, "severity", "%v", err)
		}
		r.Severity = *f.Severity
	}
	return nil
}

func (d *fileDynamic) apply(r *Dynamic, at string) error {
	if d.Enabled != nil {
		r.Enabled = *d.Enabled
	}
	if d.Method != nil {
		if *d.Method != MeanSigma && *d.Method != MedianMAD {
			return invalid(at, "method", "must be %s or %s (got %q)", MeanSigma, MedianMAD, *d.Method)
		}
		r.Method = *d.Method
	}
	if d.K != nil {
		if !(*d.K > 0 && *d.K <= 100) {
			return invalid(at, "k", "must be positive and at most 100 (got %v)", *d.K)
		}
		r.K = *d.K
	}
	if d.Severity != nil {
		if err := checkSeverity(*d.Severity); err != nil {
			return invalid(at, "severity", "%v", err)
		}
		r.Severity = *d.Severity
	}
	if d.MinChange != nil {
		if !(*d.MinChange >= 0 && *d.MinChange < 10) {
			return invalid(at, "min_change", "must be at least 0 and below 10 (got %v)", *d.MinChange)
		}
		r.MinChange = *d.MinChange
	}
	if d.MinDelta != nil {
		if !(*d.MinDelta >= 0) || math.IsInf(*d.MinDelta, 0) {
			return invalid(at, "min_delta", "must be a finite value of at least 0 (got %v)", *d.MinDelta)
		}
		r.MinDelta = *d.MinDelta
	}
	if r.Method == MedianMAD && r.MinChange == 0 && r.MinDelta == 0 && (d.MinChange != nil || d.MinDelta != nil) {
		return invalid(at, "min_delta", "min_change and min_delta are both 0: a series at one value in most of its baseline windows (an error rate that is usually 0) has a MAD of 0 and would fire at every change; keep one above 0, or set method: %s", MeanSigma)
	}
	if d.MinPoints != nil {
		if *d.MinPoints < 1 {
			return invalid(at, "min_points", "must be at least 1 (got %d)", *d.MinPoints)
		}
		r.MinPoints = int(*d.MinPoints)
	}
	if d.MinRequests != nil {
		if *d.MinRequests < 0 {
			return invalid(at, "min_requests", "must not be negative (got %d)", *d.MinRequests)
		}
		r.MinRequests = uint64(*d.MinRequests)
	}
	return nil
}

func (st *fileStatic) apply(r *StaticRule, at string, m Metric) error {
	if st.Enabled != nil {
		r.Enabled = *st.Enabled
	}
	if st.Warning != nil {
		if !(*st.Warning >= 0) || math.IsInf(*st.Warning, 0) {
			return invalid(at, "warning", "must be a finite value of at least 0, 0 for off (got %v)", *st.Warning)
		}
		r.Warning = *st.Warning
	}
	if st.Critical != nil {
		if !(*st.Critical >= 0) || math.IsInf(*st.Critical, 0) {
			return invalid(at, "critical", "must be a finite value of at least 0, 0 for off (got %v)", *st.Critical)
		}
		r.Critical = *st.Critical
	}
	if st.MinRequests != nil {
		if *st.MinRequests < 0 {
			return invalid(at, "min_requests", "must not be negative (got %d)", *st.MinRequests)
		}
		r.MinRequests = uint64(*st.MinRequests)
	}
	if st.Always != nil {
		r.Always = *st.Always
	}
	if m == ErrorRate || m == TimeoutRate {
		if r.Warning > 1 {
			return invalid(at, "warning", "%s is a fraction of requests: must be at most 1 (got %v)", m, r.Warning)
		}
		if r.Critical > 1 {
			return invalid(at, "critical", "%s is a fraction of requests: must be at most 1 (got %v)", m, r.Critical)
		}
	}
	if r.Warning > 0 && r.Critical > 0 && r.Critical < r.Warning {
		return invalid(at, "critical", "%v is below the warning threshold %v", r.Critical, r.Warning)
	}
	return nil
}

func checkSeverity(s string) error {
	if s != "warning" && s != "critical" {
		return fmt.Errorf("must be warning or critical (got %q)", s)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
