package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
	"github.com/tokenscope/tokenscope/services/emitter/internal/ingest"
	"github.com/tokenscope/tokenscope/services/emitter/internal/otlp"
	"github.com/tokenscope/tokenscope/services/emitter/internal/proxy"
	"github.com/tokenscope/tokenscope/services/emitter/internal/reqbody"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

const usage = `usage: emitter [command] [flags]

commands:
  (none)    serve the LLM gateway proxy, POST /v1/events, POST /v1/feedback, /metrics, /healthz and /readyz
            on HTTP_ADDR, and the OTLP trace receivers
  bench     measure TTFT, TPOT and total for short, medium and long prompts against an endpoint
  replay    replay an Azure LLM inference trace, against an endpoint or simulated
  fakellm   serve a fake OpenAI and Anthropic API with configurable latency and failures

Run "emitter <command> -h" for a command's flags. Configuration is read from the environment.`

// run is the whole program; main only adds signals and the exit code.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	envMap := env.ToMap(environ)
	cmd := ""
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "", "serve":
		return serve(ctx, envMap, stderr)
	case "fakellm":
		return runFakeLLM(ctx, args, envMap, stdout, stderr)
	case "bench":
		return runBench(ctx, args, envMap, stdout, stderr)
	case "replay":
		return runReplay(ctx, args, envMap, stdout, stderr)
	case "help", "-h", "--help":
		_, err := fmt.Fprintln(stdout, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return ops.NewLogger(w, level, "emitter")
}

// connectBus connects to NATS, makes sure LLM_EVENTS and FEEDBACK exist and returns a started-later
// publisher; close closes the connection.
func connectBus(ctx context.Context, cfg bus.Config, popts bus.PublisherOptions, srv *ops.Server, logger *slog.Logger) (*bus.Publisher, *nats.Conn, error) {
	nc, err := bus.Connect(cfg, "tokenscope-emitter", logger)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("cannot open JetStream: %w", err)
	}
	if err := bus.EnsureStreams(ctx, js, cfg.Streams, events.StreamEvents, events.StreamFeedback); err != nil {
		nc.Close()
		return nil, nil, err
	}
	var reg = srv.Registry()
	popts.Namespace = "emitter"
	pub := bus.NewPublisher(js, popts, reg, logger.With("component", "publisher"))
	srv.AddCheck("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected to NATS (%s)", nc.Status())
		}
		return nil
	})
	return pub, nc, nil
}

func serve(ctx context.Context, environ map[string]string, stderr io.Writer) error {
	cfg, err := parseConfig(environ)
	if err != nil {
		return err
	}
	logger := newLogger(stderr, cfg.LogLevel)
	srv := ops.NewServer(cfg.HTTPAddr, logger)
	srv.SetIdleTimeout(cfg.ClientIdleTimeout)
	if cfg.ProbeAddr != "" {
		srv.ProbesOn(cfg.ProbeAddr) // answered when HTTP_ADDR is full
	}
	// One count over HTTP_ADDR and the OTLP receivers: they share the process's memory and
	// descriptors.
	conns := ops.NewConnLimit(cfg.MaxConnections, "emitter", srv.Registry())
	srv.LimitConns(conns)
	if err := srv.Listen(); err != nil {
		return err
	}
	pub, nc, err := connectBus(ctx, cfg.NATS, cfg.publisherOptions(), srv, logger)
	if err != nil {
		return err
	}
	defer nc.Close()
	// The proxy's events and the ingest's share one bound on the subjects they make.
	subjects := subject.New(cfg.MaxSubjects, cfg.SubjectIdle, srv.Registry())
	em := emit.New(pub, subjects, srv.Registry())
	// Every request body held, the proxy's, the ingest's and the OTLP receivers', shares one
	// budget of memory.
	budget := reqbody.NewBudget(cfg.MaxParseMemory, srv.Registry())
	px := proxy.New(cfg.proxyConfig(budget), em, srv.Registry(), logger)
	defer px.Close()
	px.Register(srv)
	// Streams detached from net/http come back to it through the listener, and are waited
	// for at shutdown after the server's own requests.
	srv.WrapListener(px.Listener)
	srv.ConnContext(px.ConnContext)
	srv.OnShutdown(px.Drain)
	srv.Handle("POST /v1/events", ingest.New(ingest.Options{MaxBytes: cfg.IngestMaxBytes, Token: cfg.IngestToken, Subjects: subjects, Budget: budget},
		pub, time.Now, srv.Registry(), logger))
	srv.Handle("POST /v1/feedback", ingest.NewFeedback(ingest.Options{MaxBytes: cfg.IngestMaxBytes, Token: cfg.IngestToken, Subjects: subjects, Budget: budget},
		pub, time.Now, srv.Registry(), logger))

	otlpSrv, err := otlp.New(cfg.otlpOptions(subjects, budget), pub, time.Now, srv.Registry(), logger).
		Listen(cfg.OTLPHTTPAddr, cfg.OTLPGRPCAddr)
	if err != nil {
		return err
	}
	otlpSrv.LimitConns(conns)

	upstream := ops.RedactURL(cfg.UpstreamURL)
	routes, _ := proxy.ParseRoutes(cfg.Upstreams)
	switch {
	case cfg.proxyOff() && len(routes) == 0:
		upstream = upstreamOff
		logger.Info("the proxy is off (EMITTER_UPSTREAM_URL=none): proxied routes answer 503; POST /v1/events, POST /v1/feedback and OTLP are served")
	case cfg.proxyOff():
		upstream = upstreamOff
		logger.Info("no default upstream (EMITTER_UPSTREAM_URL=none): requests no EMITTER_UPSTREAMS route takes answer 503")
	}
	logger.Info("serving", "addr", srv.Addr(), "probes", srv.ProbesAddr(), "otlp_http", otlpSrv.HTTPAddr(), "otlp_grpc", otlpSrv.GRPCAddr(),
		"upstream", upstream, "nats", nc.ConnectedUrlRedacted())
	// The publisher outlives the listeners, so the events of requests finishing during the
	// shutdown grace are still flushed. One listener failing stops the others.
	pubCtx, stopPub := context.WithCancel(context.Background())
	g := new(errgroup.Group)
	g.Go(func() error {
		defer stopPub()
		intake, ictx := errgroup.WithContext(ctx)
		intake.Go(func() error { return srv.Run(ictx, cfg.ShutdownGrace) })
		intake.Go(func() error { return otlpSrv.Run(ictx, cfg.ShutdownGrace) })
		return intake.Wait()
	})
	g.Go(func() error { return pub.Run(pubCtx) })
	err = g.Wait()
	// What this run measured and published, the events of the requests that finished during
	// the shutdown grace included.
	logger.Info("stopped", srv.Totals("emitter_events_emitted_total", "emitter_ingest_events_accepted_total", "emitter_otlp_spans_accepted_total", "emitter_feedback_events_accepted_total",
		"emitter_published_total", "emitter_publish_dropped_total")...)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
