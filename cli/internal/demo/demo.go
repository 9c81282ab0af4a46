package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tokenscope/tokenscope/cli/internal/stack"
)

// Options configure a demo.
type Options struct {
	Root    string        // the tokenscope checkout
	Dir     string        // state: data, logs, stack.env
	BinDir  string        // the service binaries
	Build   bool          // go build the services into BinDir first
	AnyPort bool          // free ports everywhere instead of the services' defaults
	GPU     string        // auto, nvml, synthetic or off
	Trace   string        // Azure trace CSV for the proxied load; empty: a generated workload
	Speed   float64       // replay speed of the proxied load
	Window  time.Duration // AGG_WINDOW
	View    time.Duration // the live table covers this much of the recent past
	Refresh time.Duration // how often the table is redrawn
	TTY     bool          // redraw in place (a terminal) rather than print table after table
	// Incident is when a load burst overruns the fake engine's batch (zero: DefaultIncident).
	Incident Incident
}

// Validate names the bad option.
func (o Options) Validate() error {
	switch {
	case o.Root == "" || o.Dir == "" || o.BinDir == "":
		return errors.New("the checkout, state and binary folders must be set")
	case o.GPU != "auto" && o.GPU != "nvml" && o.GPU != "synthetic" && o.GPU != "off":
		return fmt.Errorf("--gpu=%q must be auto, nvml, synthetic or off", o.GPU)
	case o.Speed <= 0:
		return fmt.Errorf("--speed=%g must be positive", o.Speed)
	case o.Window < time.Second || o.Window > 24*time.Hour || o.Window%time.Second != 0:
		return fmt.Errorf("--window=%s must be a whole number of seconds from 1s to 24h (AGG_WINDOW's bounds)", o.Window)
	case o.View < o.Window:
		return fmt.Errorf("--view=%s must be at least --window=%s", o.View, o.Window)
	case o.Refresh < 500*time.Millisecond:
		return fmt.Errorf("--refresh=%s must be at least 500ms", o.Refresh)
	case o.Incident != Incident{}:
		return o.Incident.Validate()
	}
	return nil
}

// addrs are where everything listens.
type addrs struct {
	nats, ch, chHTTP, aggregator, alerter, gpuwatch, emitter, fakellm string
	otlpHTTP, otlpGRPC                                                string // the emitter's OTLP receivers
}

// Run starts everything, shows the live view until ctx ends, then stops everything in
// reverse order and says where the logs are.
func Run(ctx context.Context, o Options, out io.Writer) (err error) {
	if err := o.Validate(); err != nil {
		return err
	}
	s := &demo{o: o, out: out, logs: filepath.Join(o.Dir, "logs")}
	defer func() {
		if serr := s.stop(); serr != nil && err == nil {
			err = serr
		}
		fmt.Fprintf(out, "logs: %s\n", s.logs)
	}()
	if err := s.start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	return s.watch(ctx)
}

type demo struct {
	o     Options
	out   io.Writer
	logs  string
	a     addrs
	nats  *server.Server
	ch    *stack.ClickHouse
	procs []*stack.Proc // in starting order
	gpu   string        // what gpuwatch runs on, for the screen
	// stopping is closed when the demo begins to stop, so exits are expected.
	stopping chan struct{}
	burst    *burst // the incident's load, run by watch
}

// chatModel is the proxied scene's model, and the model_name the fake engine reports.
const chatModel = "llama-3.1-70b"

// demoTurns is the mean length of the simulated users' conversations.
const demoTurns = 4

// demoPrices is the aggregator's price table (AGG_PRICES) for the demo's two models, USD per
// million tokens, near what hosted 70B models cost.
const demoPrices = `[
  {"model": "llama-3.1-70b", "input": 0.6, "output": 0.8, "cached_input": 0.3},
  {"model": "qwen2.5-72b", "input": 0.9, "output": 1.2}
]
`

func (s *demo) incident() Incident {
	if s.o.Incident == (Incident{}) {
		return DefaultIncident
	}
	return s.o.Incident
}

func (s *demo) say(format string, args ...any) { fmt.Fprintf(s.out, format+"\n", args...) }

func (s *demo) start(ctx context.Context) error {
	s.stopping = make(chan struct{})
	o := s.o
	if _, err := stack.ClickHouseCommand(); err != nil {
		return fmt.Errorf("%w (scripts/demo.sh installs it for you)", err)
	}
	for _, d := range []string{"nats", "clickhouse"} {
		if err := os.RemoveAll(filepath.Join(o.Dir, d)); err != nil {
			return fmt.Errorf("cannot clear the previous run's %s: %w", d, err)
		}
	}
	if err := os.MkdirAll(s.logs, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", s.logs, err)
	}
	if err := s.pickAddrs(); err != nil {
		return err
	}
	if o.Build {
		s.say("building the services into %s (go build; the first time takes a minute or two)…", o.BinDir)
		if err := stack.Build(ctx, o.Root, o.BinDir, stack.Services); err != nil {
			return err
		}
	}
	for _, n := range stack.Services {
		if _, err := os.Stat(filepath.Join(o.BinDir, n)); err != nil {
			return fmt.Errorf("no %s binary in %s (run without --build=false, or make build): %w", n, o.BinDir, err)
		}
	}

	var err error
	if s.nats, err = stack.StartNATS(s.a.nats, filepath.Join(o.Dir, "nats")); err != nil {
		return err
	}
	s.say("NATS (JetStream)        nats://%s", s.a.nats)
	if s.ch, err = stack.StartClickHouse(ctx, filepath.Join(o.Dir, "clickhouse"), s.a.ch, s.a.chHTTP); err != nil {
		return err
	}
	s.say("ClickHouse              %s (native), http://%s — clickhouse-client --port %s", s.a.ch, s.a.chHTTP, port(s.a.ch))

	common := []string{"NATS_URL=nats://" + s.a.nats, "CLICKHOUSE_ADDR=" + s.a.ch, "CLICKHOUSE_HTTP_ADDR=" + s.a.chHTTP, "CLICKHOUSE_DB=tokenscope"}
	bin := func(n string) string { return filepath.Join(o.BinDir, n) }
	ready := func(p *stack.Proc, url string, what string) error {
		if err := p.WaitReady(ctx, url, 90*time.Second); err != nil {
			return err
		}
		s.say("%-23s %s", what, url)
		return nil
	}

	prices := filepath.Join(o.Dir, "prices.json")
	if err := os.WriteFile(prices, []byte(demoPrices), 0o644); err != nil {
		return fmt.Errorf("cannot write the price table: %w", err)
	}
	agg, err := s.run(stack.Cmd{Name: "aggregator", Path: bin("aggregator"), Env: append(common, "HTTP_ADDR="+s.a.aggregator,
		"AGG_WINDOW="+o.Window.String(), "AGG_LATENESS=5s", "AGG_PRICES="+prices)})
	if err != nil {
		return err
	}
	if err := ready(agg, "http://"+s.a.aggregator+"/readyz", "aggregator"); err != nil {
		return err
	}
	al, err := s.run(stack.Cmd{Name: "alerter", Path: bin("alerter"), Env: append(common, "HTTP_ADDR="+s.a.alerter, "ALERTER_SETTLE=2s")})
	if err != nil {
		return err
	}
	if err := ready(al, "http://"+s.a.alerter+"/readyz", "alerter"); err != nil {
		return err
	}
	// The fake LLM is a fake inference engine: a batch of engineBatch running requests, a
	// KV cache and a prefix cache, vLLM's metrics on /metrics, which gpuwatch reads. It
	// starts first, so gpuwatch never finds it down.
	fake, err := s.run(stack.Cmd{Name: "fakellm", Path: bin("emitter"), Args: []string{"fakellm", "-addr", s.a.fakellm,
		"-ttft", engineTTFT.String(), "-prefill-per-1k", enginePrefillPer.String(), "-tpot", engineTPOT.String(), "-error-rate", "0.01", "-rate-limit-rate", "0.01",
		"-stall-rate", "0.01", "-disconnect-rate", "0.005", "-otlp-endpoint", "http://" + s.a.otlpHTTP,
		"-max-batch", fmt.Sprint(engineBatch), "-kv-tokens", fmt.Sprint(engineKVTokens), "-prefix-cache", "-model-name", chatModel},
		// Its llm_request spans become the chat scene's engine-layer events, beside the proxy's.
		Env: []string{"OTEL_RESOURCE_ATTRIBUTES=tokenscope.scene=chat,deployment.environment.name=demo,service.instance.id=" + s.a.fakellm}})
	if err != nil {
		return err
	}
	if err := ready(fake, "http://"+s.a.fakellm+"/healthz", "fake LLM (engine)"); err != nil {
		return err
	}
	if err := s.startGPU(ctx, common); err != nil {
		return err
	}
	// The fake engine sends its opening event at once and queues the request after it, so a
	// request's wait in the incident's queue is silence inside the stream: the idle timeout
	// must be longer than that wait (a few seconds), or the queue's TTFT tail would read as
	// timeouts. A stall (it hangs until the client leaves) is still a timeout within 15 s.
	em, err := s.run(stack.Cmd{Name: "emitter", Path: bin("emitter"), Env: append(common, "HTTP_ADDR="+s.a.emitter,
		"EMITTER_UPSTREAM_URL=http://"+s.a.fakellm, "EMITTER_DEFAULT_SCENE=chat", "EMITTER_DEFAULT_ENV=demo",
		"EMITTER_STREAM_IDLE_TIMEOUT=15s", "EMITTER_UPSTREAM_TIMEOUT=30s",
		"EMITTER_OTLP_HTTP_ADDR="+s.a.otlpHTTP, "EMITTER_OTLP_GRPC_ADDR="+s.a.otlpGRPC)})
	if err != nil {
		return err
	}
	if err := ready(em, "http://"+s.a.emitter+"/readyz", "emitter (proxy, ingest)"); err != nil {
		return err
	}
	s.say("%-23s http://%s/v1/traces, gRPC %s (the fake LLM's llm_request spans)", "OTLP receivers", s.a.otlpHTTP, s.a.otlpGRPC)

	// The proxied load: real HTTP through the emitter to the fake LLM; the proxy measures
	// and publishes, so the replay itself publishes nothing. Its simulated users hold
	// conversations (the proxy's conversation and turn headers) and post, as an app does, on
	// each conversation's end whether its task was done, and for a share of them thumbs, to
	// the emitter's POST /v1/feedback.
	load := []string{"replay", "-url", "http://" + s.a.emitter, "-protocol", "openai", "-model", chatModel,
		"-loop", "-publish=false", "-concurrency", "256", "-speed", fmt.Sprint(o.Speed),
		"-turns", fmt.Sprint(demoTurns), "-feedback", "0.3", "-scene", "chat", "-env", "demo"} // the verdicts' labels: the proxy's defaults
	what := "generated conversation workload"
	if o.Trace != "" {
		load = append(load, "-trace", o.Trace)
		what = filepath.Base(o.Trace)
	} else {
		load = append(load, "-shape", "conversation", "-duration", "20m")
	}
	if _, err := s.run(stack.Cmd{Name: "replay-chat", Path: bin("emitter"), Args: load, Env: common}); err != nil {
		return err
	}
	s.say("load: scene chat        %s at %gx through the proxy to the fake LLM", what, o.Speed)
	// The simulated scene: events from the latency model, published directly. Its instance
	// is its own: it never ran on the fake engine, whose queue must not explain its TTFT.
	if _, err := s.run(stack.Cmd{Name: "replay-support", Path: bin("emitter"), Env: common, Args: []string{"replay", "-simulate",
		"-shape", "conversation", "-duration", "6m", "-loop", "-speed", "3", "-model", "qwen2.5-72b", "-scene", "support",
		"-env", "demo", "-instance", "sim-1", "-incident", "start=2m,for=2m,ttft=8", "-seed", "7", "-feedback", "0.3",
		"-turns", fmt.Sprint(demoTurns)}}); err != nil {
		return err
	}
	s.say("load: scene support     simulated events; TTFT ×8 for 40 s of every 2 minutes (alerts fire, then resolve)")
	s.say("business: both scenes   users hold conversations of %d turns on average, which end completed or abandoned;", demoTurns)
	s.say("                        30 %% of answers (chat: of conversations) rated, a fifth of support's scored for")
	s.say("                        quality; worse when slow; priced (%s): tokenscope report --business", prices)
	// The incident: a burst of chat requests beyond the engine's batch, so a queue builds
	// in the engine and TTFT grows by the time requests wait in it.
	s.burst = newBurst("http://"+s.a.emitter, chatModel, s.incident())
	in := s.incident()
	s.say("incident: scene chat    %d more clients for %s of every %s, from %s in: beyond the engine's batch of %d, a queue builds (the TTFT alert names queue time)",
		burstClients, in.For, in.Every, in.At, engineBatch)

	env := strings.Join([]string{"NATS_URL=nats://" + s.a.nats, "CLICKHOUSE_ADDR=" + s.a.ch, "CLICKHOUSE_HTTP_ADDR=" + s.a.chHTTP, "CLICKHOUSE_DB=tokenscope",
		"EMITTER_URL=http://" + s.a.emitter, "FAKELLM_URL=http://" + s.a.fakellm,
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + s.a.otlpHTTP}, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(o.Dir, "stack.env"), []byte(env), 0o644); err != nil {
		return fmt.Errorf("cannot write stack.env: %w", err)
	}
	s.say("addresses in %s; logs in %s", filepath.Join(o.Dir, "stack.env"), s.logs)
	return nil
}

// startGPU starts gpuwatch on NVML when a GPU answers, otherwise on its synthetic source,
// and says which.
func (s *demo) startGPU(ctx context.Context, common []string) error {
	if s.o.GPU == "off" {
		s.say("gpuwatch                off (--gpu=off)")
		return nil
	}
	env := append(common, "HTTP_ADDR="+s.a.gpuwatch, "GPUWATCH_HOST="+s.a.fakellm, "GPUWATCH_SYNTHETIC_PERIOD=5m",
		"GPUWATCH_ENGINES=vllm=http://"+s.a.fakellm+"/metrics")
	url := "http://" + s.a.gpuwatch + "/readyz"
	if s.o.GPU != "synthetic" {
		p, err := s.run(stack.Cmd{Name: "gpuwatch", Path: filepath.Join(s.o.BinDir, "gpuwatch"), Env: append(env, "GPUWATCH_SOURCE=nvml")})
		if err != nil {
			return err
		}
		err = p.WaitReady(ctx, url, 30*time.Second)
		if err == nil {
			s.gpu = "NVML"
			s.say("%-23s %s (NVML: this machine's GPUs)", "gpuwatch", url)
			return nil
		}
		s.procs = s.procs[:len(s.procs)-1]
		_ = p.Stop(5 * time.Second)
		if s.o.GPU == "nvml" || ctx.Err() != nil {
			return err
		}
		why := strings.TrimPrefix(lastLine(p.Log), "gpuwatch: ")
		if i := strings.Index(why, " (is the NVIDIA"); i > 0 {
			why = why[:i]
		}
		s.say("no NVIDIA GPU found (%s): gpuwatch uses its synthetic source", why)
	}
	p, err := s.run(stack.Cmd{Name: "gpuwatch", Path: filepath.Join(s.o.BinDir, "gpuwatch"), Env: append(env, "GPUWATCH_SOURCE=synthetic")})
	if err != nil {
		return err
	}
	if err := p.WaitReady(ctx, url, 30*time.Second); err != nil {
		return err
	}
	s.gpu = "synthetic"
	s.say("%-23s %s (synthetic: 2 made-up H200s)", "gpuwatch", url)
	return nil
}

// run starts a child with its log under logs.
func (s *demo) run(c stack.Cmd) (*stack.Proc, error) {
	c.Log = filepath.Join(s.logs, c.Name+".log")
	p, err := stack.Start(c)
	if err != nil {
		return nil, err
	}
	s.procs = append(s.procs, p)
	return p, nil
}

// stop stops the children in reverse order, then ClickHouse and NATS.
func (s *demo) stop() error {
	if s.stopping != nil {
		select {
		case <-s.stopping:
			return nil
		default:
			close(s.stopping)
		}
	}
	var errs []error
	if len(s.procs) > 0 || s.ch != nil || s.nats != nil {
		s.say("stopping…")
	}
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		if err := p.Stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
		s.say("  stopped %s", p.Name)
	}
	if s.ch != nil {
		if err := s.ch.Stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
		s.say("  stopped ClickHouse (data in %s)", s.ch.Dir)
	}
	if s.nats != nil {
		s.nats.Shutdown()
		s.nats.WaitForShutdown()
		s.say("  stopped NATS")
	}
	return errors.Join(errs...)
}

func (s *demo) pickAddrs() error {
	taken := map[string]bool{}
	for _, x := range []struct {
		dst       *string
		preferred string
		what      string
	}{
		{&s.a.nats, "127.0.0.1:4222", "NATS"},
		{&s.a.ch, "127.0.0.1:9000", "ClickHouse"},
		{&s.a.chHTTP, "127.0.0.1:8123", "ClickHouse HTTP"},
		{&s.a.emitter, "127.0.0.1:8080", "the emitter"},
		{&s.a.fakellm, "127.0.0.1:8081", "the fake LLM"},
		{&s.a.otlpHTTP, "127.0.0.1:4318", "the emitter's OTLP/HTTP receiver"},
		{&s.a.otlpGRPC, "127.0.0.1:4317", "the emitter's OTLP/gRPC receiver"},
		{&s.a.gpuwatch, "127.0.0.1:9102", "gpuwatch"},
		{&s.a.aggregator, "127.0.0.1:9103", "the aggregator"},
		{&s.a.alerter, "127.0.0.1:9104", "the alerter"},
	} {
		// A port another service was just given is free again until that service starts:
		// the system may hand it out twice (ClickHouse's HTTP port and the fake LLM's
		// once got the same one).
		var a string
		var moved bool
		for try := 0; a == "" || taken[a]; try++ {
			var err error
			if a, moved, err = stack.Addr(x.preferred, s.o.AnyPort); err != nil {
				return fmt.Errorf("cannot choose an address for %s: %w", x.what, err)
			}
			if taken[a] && try == 20 {
				return fmt.Errorf("cannot choose an address for %s: the system keeps giving the ports already chosen", x.what)
			}
		}
		taken[a] = true
		if moved {
			s.say("port %s is busy: %s uses %s instead", port(x.preferred), x.what, a)
		}
		*x.dst = a
	}
	return nil
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// lastLine is the last non-empty line of a log, shortened, for a one-line reason.
func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "no log"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	l := lines[len(lines)-1]
	if len(l) > 160 {
		l = l[:160] + "…"
	}
	return l
}
