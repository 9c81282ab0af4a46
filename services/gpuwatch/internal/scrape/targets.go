package scrape

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
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
			return nil, fmt.Errorf("GPUWATCH_ENGINES entry %q must be kind=URL or kind:name=URL", ops.RedactURL(entry))
		}
		// Errors show the entry with its URL's secrets hidden: an engine behind basic auth
		// has its password in the URL, one behind a gateway may have a token in its query.
		shown := key + "=" + ops.RedactURL(raw)
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
			return nil, fmt.Errorf("GPUWATCH_ENGINES entry %q: %q must be an http:// or https:// URL", shown, ops.RedactURL(raw))
		}
		out = append(out, Target{Engine: kind, Name: name, URL: raw})
	}
	if len(out) > MaxTargets {
		return nil, fmt.Errorf("GPUWATCH_ENGINES has %d engines, at most %d", len(out), MaxTargets)
	}
	return out, nil
}
