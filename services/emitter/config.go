package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/envconf"
	"github.com/tokenscope/tokenscope/services/emitter/internal/otlp"
	"github.com/tokenscope/tokenscope/services/emitter/internal/proxy"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

// Config is the emitter's configuration, from the environment.
type Config struct {
	HTTPAddr string `env:"HTTP_ADDR" envDefault:"127.0.0.1:8080"`
	// ProbeAddr serves /healthz, /readyz and /metrics alone, beside HTTP_ADDR ("": not).
	ProbeAddr string     `env:"EMITTER_PROBE_ADDR"`
	LogLevel  slog.Level `env:"LOG_LEVEL" envDefault:"info"`
	NATS      bus.Config `envPrefix:"NATS_"`

	UpstreamURL       string        `env:"EMITTER_UPSTREAM_URL" envDefault:"http://127.0.0.1:8081"` // "none" (any case) turns the proxy off
	Upstreams         string        `env:"EMITTER_UPSTREAMS"`                                       // model-prefix routes: claude-=https://api.anthropic.com,gpt-=https://api.openai.com
	UpstreamAPI       string        `env:"EMITTER_UPSTREAM_API"`                                    // the API EMITTER_UPSTREAM_URL serves: openai or anthropic; empty: anthropic for api.anthropic.com
	UpstreamTimeout   time.Duration `env:"EMITTER_UPSTREAM_TIMEOUT" envDefault:"600s"`
	StreamIdleTimeout time.Duration `env:"EMITTER_STREAM_IDLE_TIMEOUT" envDefault:"60s"`
	ClientIdleTimeout time.Duration `env:"EMITTER_CLIENT_IDLE_TIMEOUT" envDefault:"2m"`
	MaxConnections    int           `env:"EMITTER_MAX_CONNECTIONS" envDefault:"10000"`
	DefaultScene      string        `env:"EMITTER_DEFAULT_SCENE" envDefault:"default"`
	DefaultEnv        string        `env:"EMITTER_DEFAULT_ENV" envDefault:"dev"`
	MaxParseBytes     int64         `env:"EMITTER_MAX_PARSE_BYTES" envDefault:"33554432"`
	MaxParseMemory    int64         `env:"EMITTER_MAX_PARSE_MEMORY" envDefault:"536870912"`
	MaxLabels         int           `env:"EMITTER_MAX_LABELS" envDefault:"200"`
	MaxSubjects       int           `env:"EMITTER_MAX_SUBJECTS" envDefault:"1000"`
	SubjectIdle       time.Duration `env:"EMITTER_SUBJECT_IDLE" envDefault:"1h"`
	MaxSSEEventBytes  int           `env:"EMITTER_MAX_SSE_EVENT_BYTES" envDefault:"1048576"`
	RelayLoops        int           `env:"EMITTER_RELAY_LOOPS" envDefault:"0"`

	IngestToken    string `env:"EMITTER_INGEST_TOKEN"`
	IngestMaxBytes int64  `env:"EMITTER_INGEST_MAX_BYTES" envDefault:"16777216"`

	OTLPHTTPAddr     string   `env:"EMITTER_OTLP_HTTP_ADDR" envDefault:"127.0.0.1:4318"` // "off" turns it off
	OTLPGRPCAddr     string   `env:"EMITTER_OTLP_GRPC_ADDR" envDefault:"127.0.0.1:4317"`
	OTLPMaxBytes     int64    `env:"EMITTER_OTLP_MAX_BYTES" envDefault:"16777216"`
	OTLPEnvKeys      []string `env:"EMITTER_OTLP_ENV_KEYS" envSeparator:"," envDefault:"tokenscope.env,deployment.environment.name,deployment.environment"`
	OTLPSceneKeys    []string `env:"EMITTER_OTLP_SCENE_KEYS" envSeparator:"," envDefault:"tokenscope.scene,service.name"`
	OTLPInstanceKeys []string `env:"EMITTER_OTLP_INSTANCE_KEYS" envSeparator:"," envDefault:"service.instance.id,host.name"`
	OTLPTenantKeys   []string `env:"EMITTER_OTLP_TENANT_KEYS" envSeparator:"," envDefault:"tokenscope.tenant"`

	PublishBuffer int           `env:"EMITTER_PUBLISH_BUFFER" envDefault:"100000"`
	PublishBytes  int64         `env:"EMITTER_PUBLISH_BUFFER_BYTES" envDefault:"134217728"`
	PublishLinger time.Duration `env:"EMITTER_PUBLISH_LINGER" envDefault:"20ms"`
	ShutdownGrace time.Duration `env:"EMITTER_SHUTDOWN_GRACE" envDefault:"30s"`
}

func parseConfig(environ map[string]string) (Config, error) {
	return envconf.Load[Config](func(k string) string { return environ[k] })
}

// Validate names the first variable with a bad value.
func (c Config) Validate() error {
	if c.HTTPAddr == "" {
		return errors.New("HTTP_ADDR is empty")
	}
	if err := c.NATS.Validate(); err != nil {
		return err
	}
	if err := c.validateUpstream(); err != nil {
		return err
	}
	if _, err := proxy.ParseRoutes(c.Upstreams); err != nil {
		return fmt.Errorf("EMITTER_UPSTREAMS: %w", err)
	}
	if c.UpstreamAPI != "" && c.UpstreamAPI != proxy.APIOpenAI && c.UpstreamAPI != proxy.APIAnthropic {
		return fmt.Errorf("EMITTER_UPSTREAM_API=%q must be openai or anthropic", c.UpstreamAPI)
	}
	if c.UpstreamAPI != "" && c.proxyOff() {
		return fmt.Errorf("EMITTER_UPSTREAM_API=%s names the API of EMITTER_UPSTREAM_URL, which is none: unset it", c.UpstreamAPI)
	}
	switch {
	case c.UpstreamTimeout <= 0:
		return fmt.Errorf("EMITTER_UPSTREAM_TIMEOUT=%s must be positive", c.UpstreamTimeout)
	case c.StreamIdleTimeout <= 0:
		return fmt.Errorf("EMITTER_STREAM_IDLE_TIMEOUT=%s must be positive", c.StreamIdleTimeout)
	case c.ClientIdleTimeout <= 0:
		return fmt.Errorf("EMITTER_CLIENT_IDLE_TIMEOUT=%s must be positive", c.ClientIdleTimeout)
	case c.ProbeAddr != "" && c.ProbeAddr == c.HTTPAddr:
		return fmt.Errorf("EMITTER_PROBE_ADDR and HTTP_ADDR are both %s", c.HTTPAddr)
	case c.MaxConnections < 1:
		return fmt.Errorf("EMITTER_MAX_CONNECTIONS=%d must be at least 1", c.MaxConnections)
	case c.DefaultScene == "":
		return errors.New("EMITTER_DEFAULT_SCENE is empty")
	case c.DefaultEnv == "":
		return errors.New("EMITTER_DEFAULT_ENV is empty")
	case c.MaxParseBytes < 1024:
		return fmt.Errorf("EMITTER_MAX_PARSE_BYTES=%d must be at least 1024", c.MaxParseBytes)
	case c.MaxParseMemory < c.MaxParseBytes:
		return fmt.Errorf("EMITTER_MAX_PARSE_MEMORY=%d must be at least EMITTER_MAX_PARSE_BYTES=%d", c.MaxParseMemory, c.MaxParseBytes)
	case c.MaxLabels < 1:
		return fmt.Errorf("EMITTER_MAX_LABELS=%d must be at least 1", c.MaxLabels)
	case c.MaxSubjects < 1:
		return fmt.Errorf("EMITTER_MAX_SUBJECTS=%d must be at least 1", c.MaxSubjects)
	case c.SubjectIdle <= 0:
		return fmt.Errorf("EMITTER_SUBJECT_IDLE=%s must be positive", c.SubjectIdle)
	case c.RelayLoops < 0:
		return fmt.Errorf("EMITTER_RELAY_LOOPS=%d must be 0 (one per GOMAXPROCS) or more", c.RelayLoops)
	case c.MaxSSEEventBytes < 1024:
		return fmt.Errorf("EMITTER_MAX_SSE_EVENT_BYTES=%d must be at least 1024", c.MaxSSEEventBytes)
	case c.IngestMaxBytes < 1024:
		return fmt.Errorf("EMITTER_INGEST_MAX_BYTES=%d must be at least 1024", c.IngestMaxBytes)
	case c.MaxParseMemory < c.IngestMaxBytes:
		return fmt.Errorf("EMITTER_MAX_PARSE_MEMORY=%d must be at least EMITTER_INGEST_MAX_BYTES=%d", c.MaxParseMemory, c.IngestMaxBytes)
	case c.OTLPHTTPAddr == "":
		return errors.New("EMITTER_OTLP_HTTP_ADDR is empty (off turns the receiver off)")
	case c.OTLPGRPCAddr == "":
		return errors.New("EMITTER_OTLP_GRPC_ADDR is empty (off turns the receiver off)")
	case c.OTLPHTTPAddr != otlp.Off && c.OTLPHTTPAddr == c.OTLPGRPCAddr:
		return fmt.Errorf("EMITTER_OTLP_HTTP_ADDR and EMITTER_OTLP_GRPC_ADDR are both %s", c.OTLPHTTPAddr)
	case c.OTLPMaxBytes < 1024 || c.OTLPMaxBytes > 1<<30:
		return fmt.Errorf("EMITTER_OTLP_MAX_BYTES=%d must be between 1024 and 1073741824", c.OTLPMaxBytes)
	case (c.OTLPHTTPAddr != otlp.Off || c.OTLPGRPCAddr != otlp.Off) && c.MaxParseMemory < 2*c.OTLPMaxBytes:
		// An OTLP request is held beside its decompressed form.
		return fmt.Errorf("EMITTER_MAX_PARSE_MEMORY=%d must be at least twice EMITTER_OTLP_MAX_BYTES=%d", c.MaxParseMemory, c.OTLPMaxBytes)
	case c.PublishBuffer < 1:
		return fmt.Errorf("EMITTER_PUBLISH_BUFFER=%d must be at least 1", c.PublishBuffer)
	case c.PublishBytes < 1<<20:
		return fmt.Errorf("EMITTER_PUBLISH_BUFFER_BYTES=%d must be at least 1048576", c.PublishBytes)
	case c.PublishLinger < 0 || c.PublishLinger > time.Second:
		return fmt.Errorf("EMITTER_PUBLISH_LINGER=%s must be between 0 and 1s", c.PublishLinger)
	case c.ShutdownGrace <= 0:
		return fmt.Errorf("EMITTER_SHUTDOWN_GRACE=%s must be positive", c.ShutdownGrace)
	}
	return nil
}

// upstreamOff is the EMITTER_UPSTREAM_URL that turns the proxy off, in any case.
const upstreamOff = "none"

// proxyOff reports whether EMITTER_UPSTREAM_URL is none: no default upstream, the proxied
// routes answer 503 but those EMITTER_UPSTREAMS routes take.
func (c Config) proxyOff() bool {
	return strings.EqualFold(strings.TrimSpace(c.UpstreamURL), upstreamOff)
}

func (c Config) validateUpstream() error {
	if c.proxyOff() {
		return nil
	}
	if _, err := proxy.ParseUpstream(c.UpstreamURL); err != nil {
		if !strings.Contains(c.UpstreamURL, "://") {
			// off, disabled, false, a host without a scheme: say what turns the proxy off.
			return fmt.Errorf("EMITTER_UPSTREAM_URL: %w, or none (in any case) to turn the proxy off", err)
		}
		return fmt.Errorf("EMITTER_UPSTREAM_URL: %w", err)
	}
	return nil
}

// otlpOptions are the OTLP receivers' options; the ingest token applies to them too.
func (c Config) otlpOptions(subjects *subject.Limit, budget *reqbody.Budget) otlp.Options {
	keys := func(ks []string) []string {
		out := make([]string, 0, len(ks))
		for _, k := range ks {
			if k = strings.TrimSpace(k); k != "" {
				out = append(out, k)
			}
		}
		return out
	}
	return otlp.Options{
		Labels: otlp.Labels{Env: keys(c.OTLPEnvKeys), Scene: keys(c.OTLPSceneKeys), Instance: keys(c.OTLPInstanceKeys),
			Tenant: keys(c.OTLPTenantKeys), DefaultEnv: c.DefaultEnv, DefaultScene: c.DefaultScene},
		MaxBytes: c.OTLPMaxBytes, Token: c.IngestToken, Subjects: subjects, Budget: budget,
	}
}

func (c Config) publisherOptions() bus.PublisherOptions {
	return bus.PublisherOptions{Buffer: c.PublishBuffer, BufferBytes: c.PublishBytes, Linger: c.PublishLinger}
}

func (c Config) proxyConfig(budget *reqbody.Budget) proxy.Config {
	var up *url.URL // none: nil
	if !c.proxyOff() {
		up, _ = proxy.ParseUpstream(c.UpstreamURL)
	}
	routes, _ := proxy.ParseRoutes(c.Upstreams)
	return proxy.Config{Upstream: up, Routes: routes, UpstreamAPI: c.UpstreamAPI, UpstreamTimeout: c.UpstreamTimeout, IdleTimeout: c.StreamIdleTimeout,
		DefaultScene: c.DefaultScene, DefaultEnv: c.DefaultEnv, MaxParseBytes: c.MaxParseBytes, Budget: budget, MaxLabels: c.MaxLabels,
		MaxEventBytes: c.MaxSSEEventBytes, Loops: c.RelayLoops, ClientIdleTimeout: c.ClientIdleTimeout}
}
