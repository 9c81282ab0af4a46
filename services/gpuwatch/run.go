package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/exporter"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/hostsource"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/nvmlsource"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/replay"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/sampler"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/scrape"
	"github.com/tokenscope/tokenscope/services/gpuwatch/internal/synthetic"
)

// shutdownTimeout bounds each step of the shutdown: HTTP, publishing what is buffered,
// draining NATS.
const shutdownTimeout = 5 * time.Second

// source is what the sampler reads; each kind also may need to run beside it and to be
// closed after it.
type source struct {
	sample interface {
		Sample(ctx context.Context, now time.Time, dst []events.GPUSample) []events.GPUSample
	}
	run   func(ctx context.Context) error // nil when the source has nothing to run
	close func() error
}

// run is gpuwatch: it returns when ctx ends (nil) or when something fails.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := parseConfig(getenv, os.Hostname)
	if err != nil {
		return err
	}
	level, _ := parseLevel(cfg.LogLevel) // Validate has checked it
	logger := ops.NewLogger(stdout, level, "gpuwatch")

	srv := ops.NewServer(cfg.HTTPAddr, logger.With("component", "http"))
	srv.LimitConns(ops.NewConnLimit(ops.DefaultMaxConns, "gpuwatch", srv.Registry())) // probes and scrapes need a handful
	reg := srv.Registry()

	// The source first: without NVML there is nothing to do, and saying so beats a NATS error.
	src, err := openSource(cfg, reg, logger.With("component", "source"))
	if err != nil {
		return err
	}
	defer func() {
		if err := src.close(); err != nil {
			logger.Error("cannot close the GPU source", "err", err)
		}
	}()
	var host *hostsource.Source
	if cfg.HostStats {
		host, err = hostsource.New(hostsource.Options{ProcRoot: cfg.ProcRoot, SysRoot: cfg.SysRoot}, reg, logger.With("component", "host"))
		if err != nil {
			return fmt.Errorf("GPUWATCH_PROC_ROOT=%s, GPUWATCH_SYS_ROOT=%s: %w (on a host without procfs set GPUWATCH_HOST_STATS=false)",
				cfg.ProcRoot, cfg.SysRoot, err)
		}
	}
	if err := srv.Listen(); err != nil {
		return err
	}

	nc, err := bus.Connect(cfg.NATS, "gpuwatch "+cfg.Host, logger.With("component", "nats"))
	if err != nil {
		return err
	}
	defer drain(nc, logger)
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cannot open JetStream: %w", err)
	}
	ensureCtx, cancel := context.WithTimeout(ctx, cfg.NATS.ConnectTimeout+10*time.Second)
	streams := []string{events.StreamGPU}
	engines, _ := scrape.ParseTargets(cfg.Engines) // Validate has checked them
	if len(engines) > 0 {
		streams = append(streams, events.StreamEngine)
	}
	if host != nil {
		streams = append(streams, events.StreamHost)
	}
	err = bus.EnsureStreams(ensureCtx, js, cfg.NATS.Streams, streams...)
	cancel()
	if err != nil {
		return err
	}

	pub := bus.NewPublisher(js, bus.PublisherOptions{Buffer: cfg.PublishBuffer, BufferBytes: cfg.PublishBytes, Namespace: "gpuwatch", FlushTimeout: shutdownTimeout},
		reg, logger.With("component", "publisher"))
	exp := exporter.New()
	reg.MustRegister(exp)
	sopts := sampler.Options{Host: cfg.Host, Interval: cfg.Interval}
	if host != nil {
		sopts.HostReader = host // a nil *Source in the interface would not be nil
	}
	smp := sampler.New(src.sample, pub, exp, sopts, reg, logger.With("component", "sampler"))

	var scr *scrape.Scraper
	if len(engines) > 0 {
		scr = scrape.New(engines, pub, scrape.Options{Host: cfg.Host, Interval: cfg.Interval, Timeout: cfg.EngineTimeout,
			MaxBytes: cfg.EngineMaxBytes, MaxModels: cfg.EngineMaxModels, MaxSeries: cfg.EngineMaxSeries}, reg, logger.With("component", "scrape"))
	}

	srv.AddCheck("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected to NATS (%s); samples are buffered", nc.Status())
		}
		return nil
	})
	srv.AddCheck("samples", func(context.Context) error {
		last := smp.LastTick()
		switch {
		case last.IsZero():
			return errors.New("no tick yet")
		case time.Since(last) > 3*cfg.Interval+time.Second:
			return fmt.Errorf("last tick %s ago, interval %s", time.Since(last).Round(time.Millisecond), cfg.Interval)
		}
		return nil
	})

	logger.Info("gpuwatch started", "host", cfg.Host, "source", cfg.Source, "interval", cfg.Interval,
		"subject", events.GPUSampleSubject(cfg.Host), "engines", len(engines), "host_stats", host != nil, "http", srv.Addr())

	// The publisher outlives the sampler, so the last tick's samples are published too.
	pubCtx, stopPub := context.WithCancel(context.Background())
	defer stopPub()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(gctx, shutdownTimeout) })
	// The publisher stops once both the sampler and the scraper have.
	var producers errgroup.Group
	producers.Go(func() error { return smp.Run(gctx) })
	if scr != nil {
		producers.Go(func() error { return scr.Run(gctx) })
	}
	g.Go(func() error {
		defer stopPub()
		return producers.Wait()
	})
	g.Go(func() error {
		if err := pub.Run(pubCtx); err != nil {
			logger.Error("samples lost at shutdown", "err", err)
		}
		return nil
	})
	if src.run != nil {
		g.Go(func() error { return src.run(gctx) })
	}
	err = g.Wait()
	// What this run sampled and published, the last tick's samples included.
	logger.Info("gpuwatch stopped", srv.Totals("gpuwatch_ticks_total", "gpuwatch_samples_total",
		"gpuwatch_engine_samples_total", "gpuwatch_host_samples_total", "gpuwatch_published_total", "gpuwatch_publish_dropped_total")...)
	return err
}

// openSource opens the source cfg.Source names.
func openSource(cfg Config, reg prometheus.Registerer, logger *slog.Logger) (source, error) {
	noop := func() error { return nil }
	switch cfg.Source {
	case events.SourceReplay:
		r, err := replay.Open(cfg.ReplayFile, time.Now())
		if err != nil {
			return source{}, err
		}
		logger.Info("replaying recorded samples", "file", cfg.ReplayFile, "loop", r.Period())
		return source{sample: r, close: noop}, nil
	case events.SourceSynthetic:
		s, err := synthetic.New(synthetic.Options{
			GPUs: cfg.Synthetic.GPUs, Seed: cfg.Synthetic.Seed, Period: cfg.Synthetic.Period,
			Host: cfg.Host, Start: time.Now(),
		})
		if err != nil {
			return source{}, err
		}
		logger.Info("making up samples from the synthetic model", "gpus", cfg.Synthetic.GPUs, "seed", cfg.Synthetic.Seed)
		return source{sample: s, close: noop}, nil
	default:
		lib, err := nvmlsource.Load(cfg.NVMLLibrary)
		if err != nil {
			return source{}, err
		}
		// A tick waits for the GPUs' reads a quarter of the interval at most: a GPU slower than
		// that goes out at a later tick and the others do not wait for it.
		wait := min(cfg.Interval/4, nvmlsource.DefaultWait)
		s, err := nvmlsource.New(lib, nvmlsource.Options{PCIeInterval: cfg.PCIeInterval, Recheck: cfg.Recheck, Wait: wait}, reg, logger)
		if err != nil {
			_ = lib.Shutdown()
			return source{}, err
		}
		return source{sample: s, run: s.Run, close: s.Close}, nil
	}
}

// drain stops NATS after the publisher has flushed: Drain, then wait for the close.
func drain(nc *nats.Conn, logger *slog.Logger) {
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(shutdownTimeout):
		logger.Warn("NATS did not drain in time; closing", "timeout", shutdownTimeout)
		nc.Close()
	}
}
