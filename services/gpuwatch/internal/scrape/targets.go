package scrape

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Target is one engine endpoint to scrape.
type Target struct {
	Engine string // vllm, sglang or tgi: which names it exports
	Name   string // unique on the host; the engine kind unless given as kind:name
	URL    string
}

// MaxTargets bounds GPUWATCH_ENGINES.
const MaxTargets = 64

// ParseTargets reads GPUWATCH_ENGINES: comma-separated kind=URL or kind:name=URL entries,
// kind being vllm, sglang or tgi. An empty string is no engines. Errors name the variable.
func ParseTargets(s string) ([]Target, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []Target
	seen := map[string]bool{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		key, raw, ok := strings.Cut(entry, "=")
		if !ok || key == "" || raw == "" {
			return nil, fmt.Errorf("GPUWATCH_ENGINES entry %q must be kind=URL or kind:name=URL", redactURL(entry))
		}
		// Errors show the entry with its URL's password hidden: an engine behind basic
		// auth has it in the URL.
		shown := key + "=" + redactURL(raw)
		kind, name, named := strings.Cut(key, ":")
		if !named {
			name = kind
		}
		switch kind {
		case events.EngineVLLM, events.EngineSGLang, events.EngineTGI:
		default:
			return nil, fmt.Errorf("GPUWATCH_ENGINES entry %q: engine %q must be vllm, sglang or tgi", shown, kind)
		}
		if name == "" || len(name) > 64 || events.Token(name) != name {
			return nil, fmt.Errorf("GPUWATCH_ENGINES entry %q: name %q must be 1 to 64 ASCII letters, digits, '-' or '_'", shown, name)
		}
		if seen[name] {
			return nil, fmt.Errorf("GPUWATCH_ENGINES names %q twice; give each endpoint its own name (kind:name=URL)", name)
		}
		seen[name] = true
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("GPUWATCH_ENGINES entry %q: %q must be an http:// or https:// URL", shown, redactURL(raw))
		}
		out = append(out, Target{Engine: kind, Name: name, URL: raw})
	}
	if len(out) > MaxTargets {
		return nil, fmt.Errorf("GPUWATCH_ENGINES has %d engines, at most %d", len(out), MaxTargets)
	}
	return out, nil
}

// redactURL returns raw with the password of its user info replaced by "xxxxx", for logs and
// errors; a value that does not parse as a URL is not shown at all, since where its secret
// lies is unknown.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(a value that is not a URL)"
	}
	if u.User == nil && strings.Contains(raw, "@") {
		return "(a URL that is not shown: it may hold a password)" // opaque, such as user:pass@host
	}
	return u.Redacted()
}
