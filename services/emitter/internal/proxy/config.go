package proxy

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
)

// Route sends models whose name starts with Prefix to URL.
type Route struct {
	Prefix string
	URL    *url.URL
}

// Config is what the proxy needs; the service fills it from EMITTER_* variables.
type Config struct {
	// Upstream is where a model no route matches goes; nil: nowhere, such a request is
	// answered 503 (EMITTER_UPSTREAM_URL=none).
	Upstream *url.URL
	Routes   []Route // tried in order; the first prefix that matches wins
	// UpstreamAPI is the API Upstream serves, APIOpenAI or APIAnthropic (see route); empty:
	// DefaultAPI of Upstream.
	UpstreamAPI     string
	UpstreamTimeout time.Duration // until the upstream's response headers
	IdleTimeout     time.Duration // longest silence inside a response body
	DefaultScene    string
	DefaultEnv      string
	MaxParseBytes   int64 // request bodies larger than this pass through unread
	// Budget is the memory request bodies read and held until their upstream answers take,
	// shared with the process's other request bodies; a body that does not fit passes
	// through unread. nil: one of reqbody.DefaultLimit of its own.
	Budget        *reqbody.Budget
	MaxLabels     int // distinct model values in metric labels before folding into "other"
	MaxEventBytes int // the longest SSE event the meter reads; a longer one passes through unread
	Loops         int // relay loops (Linux); 0: GOMAXPROCS
	// ClientIdleTimeout closes a kept-alive client connection given back after a detached
	// stream once it waited that long for its next request; 0: DefaultClientIdleTimeout.
	// The HTTP server's own http.Server.IdleTimeout should be the same.
	ClientIdleTimeout time.Duration
	// BodyIdle is how long a request body read before it goes upstream may send nothing
	// before it is answered 408; 0: reqbody.IdleTimeout.
	BodyIdle time.Duration
}

// DefaultClientIdleTimeout is Config.ClientIdleTimeout's default.
const DefaultClientIdleTimeout = 2 * time.Minute

// ParseRoutes parses "prefix=url,prefix=url" (EMITTER_UPSTREAMS), such as
// "claude-=https://api.anthropic.com,gpt-=https://api.openai.com".
func ParseRoutes(s string) ([]Route, error) {
	var out []Route
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		prefix, raw, ok := strings.Cut(part, "=")
		if !ok || prefix == "" {
			// Not quoted: it may be a URL with a key in it.
			return nil, fmt.Errorf("route %d (%d bytes) is not prefix=url", len(out)+1, len(part))
		}
		u, err := ParseUpstream(raw)
		if err != nil {
			return nil, fmt.Errorf("route %q: %w", prefix, err)
		}
		out = append(out, Route{Prefix: prefix, URL: u})
	}
	return out, nil
}

// ParseUpstream parses an upstream base URL such as https://api.openai.com or
// http://127.0.0.1:8081; a path in it (https://host/openai) prefixes every request's path.
func ParseUpstream(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		// Not url.Parse's reason: it quotes the part that does not parse, a password
		// (https://user:sk-…, its @host left out) as well as any.
		return nil, fmt.Errorf("upstream URL %q does not parse as a URL", ops.RedactURL(raw))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream URL %q must be http:// or https:// with a host", ops.RedactURL(raw))
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	// A base URL written the SDK way (…/v1) must not double the /v1 of the request path.
	u.Path = strings.TrimSuffix(u.Path, "/v1")
	return u, nil
}

func (c *Config) upstream(model string) *url.URL {
	for _, r := range c.Routes {
		if strings.HasPrefix(model, r.Prefix) {
			return r.URL
		}
	}
	return c.Upstream
}

// The APIs a request can belong to, and an upstream serve.
const (
	APIOpenAI    = "openai" // OpenAI's, which OpenAI-compatible servers (vLLM, SGLang, TGI, …) serve too
	APIAnthropic = "anthropic"
)

// DefaultAPI is the API an upstream is taken to serve unless told: Anthropic's for
// api.anthropic.com, OpenAI's for any other.
func DefaultAPI(u *url.URL) string {
	if u != nil && strings.EqualFold(u.Hostname(), "api.anthropic.com") {
		return APIAnthropic
	}
	return APIOpenAI
}

// route is where a request goes: by its model when the proxy read one, by its API otherwise
// (a model list, a batch, a body it did not read), so that neither provider gets the
// other's key; nil where neither the default upstream (EMITTER_UPSTREAM_URL=none) nor a
// route takes it. A request of the API the default upstream serves goes there; one of the other
// API goes where a model named claude-… (Anthropic's) or gpt-… (OpenAI's) goes, which is the
// default upstream when no route takes it.
func (c *Config) route(model string, anthropic bool) *url.URL {
	if model != "" {
		return c.upstream(model)
	}
	api, family := APIOpenAI, "gpt"
	if anthropic {
		api, family = APIAnthropic, "claude"
	}
	if c.Upstream == nil {
		return c.upstream(family + "-") // a route, or nil: no upstream serves that API
	}
	served := c.UpstreamAPI
	if served == "" {
		served = DefaultAPI(c.Upstream)
	}
	if served != api {
		return c.upstream(family + "-") // where a plain gpt-… or claude-… model goes
	}
	return c.Upstream
}

// anthropicRequest reports whether a request belongs to Anthropic's API: its path is under
// /v1/messages, or it carries Anthropic's version header, as every request of Anthropic's
// SDKs and Claude Code does (OpenAI's SDKs do not; an X-Api-Key header alone tells nothing,
// other gateways take keys in it too).
func anthropicRequest(r *http.Request) bool {
	return r.URL.Path == "/v1/messages" || strings.HasPrefix(r.URL.Path, "/v1/messages/") ||
		r.Header.Get("Anthropic-Version") != ""
}
