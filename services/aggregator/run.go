package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/schemas"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/lease"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/price"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/sink"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// run serves until ctx ends: it stops pulling, writes every closed window and saves the
// replay floor, and leaves open windows above it for the next start, so nothing is lost.
// It counts only while it holds the lease of its AGG_CONSUMER (package lease): until then it
// waits. If it loses the lease it stops counting without writing anything more, drops what
// it held and waits for the lease again, as a process just started would: it takes it back
// when no other process took it meanwhile, and stands by otherwise.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	level, _ := parseLevel(cfg.LogLevel)
	logger := ops.NewLogger(stdout, level, "aggregator")

	prices, err := price.Load(cfg.Agg.Prices)
	if err != nil {
		return err
	}
	buckets, _ := events.ParseBuckets(cfg.Agg.Buckets)

	srv := ops.NewServer(cfg.HTTPAddr, logger)
	srv.LimitConns(ops.NewConnLimit(ops.DefaultMaxConns, "aggregator", srv.Registry())) // probes and scrapes need a handful
	if err := srv.Listen(); err != nil {
		return err
	}

	nc, err := bus.Connect(cfg.NATS, "tokenscope-aggregator", logger)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cannot use JetStream: %w", err)
	}
	if err := bus.EnsureStreams(ctx, js, cfg.NATS.Streams, events.StreamEvents, events.StreamGPU, events.StreamEngine, events.StreamRollups, events.StreamFeedback); err != nil {
		return err
	}

	db, err := chdb.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer db.Close()
	migration, err := db.Migrate(ctx, schemas.Migrations())
	if err != nil {
		return err
	}
	migration.Log(logger, db.Version())

	// Serving from now on: /readyz tells a process that waits for the lease.
	srvCtx, stopSrv := context.WithCancel(context.Background())
	srvErr, srvDone := make(chan error, 1), make(chan struct{})
	go func() {
		srvErr <- srv.Run(srvCtx, 5*time.Second)
		close(srvDone)
	}()
	defer func() {
		stopSrv()
		<-srvDone
	}()
	srv.AddCheck("nats", func(context.Context) error {
		if !nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	})
	srv.AddCheck("clickhouse", db.Ping)
	l, err := lease.Open(ctx, js, cfg.Agg.Consumer, cfg.Agg.LeaseTTL, cfg.NATS.Streams.Replicas, srv.Registry(), logger)
	if err != nil {
		return err
	}
	srv.AddCheck("lease", l.Check)
	// What a term of the lease makes again: the pipelines' metrics live on, and the checks
	// ask the pipelines of the term that counts.
	metrics := pipeline.NewMetrics(srv.Registry())
	pipes := &termPipes{}
	srv.AddCheck("clickhouse_writes", func(ctx context.Context) error {
		for _, p := range pipes.get() {
			if err := p.Stalled(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	srv.AddCheck("streams", func(ctx context.Context) error {
		for _, p := range pipes.get() {
			if err := p.Remade(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	var kerr error
	reg := &termRegisterer{Registerer: srv.Registry()}
	for {
		if err := l.Acquire(ctx); err != nil {
			if ctx.Err() != nil {
				logger.Info("stopped while waiting for the lease")
				return nil
			}
			return err
		}
		// Renewed until everything below has stopped; should it be lost, counting stops first.
		runCtx, cancelRun := context.WithCancel(ctx)
		keepCtx, stopKeep := context.WithCancel(context.Background())
		keepDone := make(chan error, 1)
		go func() {
			err := l.Keep(keepCtx)
			if err != nil {
				cancelRun()
			}
			keepDone <- err
		}()
		var unsettled bool
		err = counting(runCtx, cfg, logger, srv, srvErr, nc, js, db, buckets, prices, metrics, pipes, reg, l.Held(), &unsettled)
		stopKeep()
		kerr = <-keepDone
		cancelRun()
		pipes.set(nil)
		if kerr == nil && unsettled {
			// An insert this process gave up on may still land: the next process must not read
			// the ledger before it has, so it waits for the lease to go stale, as after a crash.
			logger.Warn("a write to ClickHouse was left unfinished; the lease is not released, and the next process waits AGG_LEASE_TTL", "ttl", cfg.Agg.LeaseTTL.String())
			l.Abandon()
		}
		if kerr == nil && !unsettled {
			// Nothing more is written: the next process may start at once.
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if rerr := l.Release(rctx); rerr != nil {
				logger.Warn("the next process will wait for the lease to go stale", "err", rerr)
			}
			cancel()
		}
		if kerr == nil || !errors.Is(kerr, lease.ErrLost) || ctx.Err() != nil {
			break
		}
		// Lost: this term's pipelines have stopped and what they held is dropped. Nothing of it
		// was acknowledged (the consumer acknowledges nothing) nor saved in the floor, so the
		// next term, started from the floor and the ledger as at a start, reads it again. Its
		// publisher, outbox sweeper and watermarks leave /metrics, as they are not in a process
		// that never held the lease: a watermark left at the lost term's would age while
		// another process publishes.
		reg.release()
		logger.Warn("waiting for the lease again; counting starts again from the floor once it is held")
	}
	if derr := drain(nc); derr != nil {
		logger.Warn("cannot drain the NATS connection", "err", derr)
	}
	// What this run wrote and published, the last flush included.
	logger.Info("stopped", srv.Totals("aggregator_events_total", "aggregator_rows_written_total", "aggregator_invalid_total",
		"aggregator_published_total", "aggregator_publish_dropped_total")...)
	if kerr != nil {
		return kerr
	}
	return err
}

// counting runs the pipelines until ctx ends (or held does, the lease lost) and returns once
// they and the rollup publisher have stopped; unsettled tells whether one left a write
// unfinished.
func counting(ctx context.Context, cfg Config, logger *slog.Logger, srv *ops.Server, srvErr <-chan error, nc *nats.Conn, js jetstream.JetStream, db *chdb.DB,
	buckets events.Buckets, prices *price.Table, metrics *pipeline.Metrics, current *termPipes, reg *termRegisterer, held context.Context, unsettled *bool) error {
	var err error
	pub := bus.NewPublisher(js, bus.PublisherOptions{Buffer: cfg.Agg.PublishBuffer, Namespace: "aggregator"}, reg, logger)
	deps := pipeline.Deps{JS: js, NC: nc, CH: db.Conn(), Publisher: pub, Metrics: metrics, Logger: logger}
	if cfg.Agg.StoreRequests {
		if deps.Requests, err = sink.NewRequestWriter(ctx, db.Conn(), cfg.ClickHouse, cfg.Agg.Consumer); err != nil {
			return err
		}
	}
	wcfg := window.Config{Window: cfg.Agg.Window, Lateness: cfg.Agg.Lateness, Buckets: buckets, MaxSeries: cfg.Agg.MaxSeries, Compression: cfg.Agg.Compression}
	opts := func(stream, filter string) pipeline.Options {
		return pipeline.Options{
			Stream: stream, Filter: filter, Consumer: cfg.Agg.Consumer,
			Replicas: cfg.NATS.Streams.Replicas, PullBatch: cfg.Agg.PullBatch,
			FlushEvery: cfg.Agg.FlushInterval, WriteTimeout: cfg.Agg.WriteTimeout, MaxBuffered: cfg.Agg.MaxBuffered,
			Held: held,
		}
	}
	pipes := []*pipeline.Pipeline{}
	tokens, err := pipeline.NewTokens(ctx, opts(events.StreamEvents, cfg.Agg.Filter), wcfg, prices, deps)
	if err != nil {
		return err
	}
	pipes = append(pipes, tokens)
	if cfg.Agg.GPU {
		gpu, err := pipeline.NewGPU(ctx, opts(events.StreamGPU, events.SubjectGPUSamplesAll), wcfg, deps)
		if err != nil {
			return err
		}
		pipes = append(pipes, gpu)
		host, err := hostPipeline(ctx, js, cfg, opts(events.StreamHost, events.SubjectHostSamplesAll), wcfg, deps)
		if err != nil {
			return err
		}
		pipes = append(pipes, host)
	}
	if cfg.Agg.Engine {
		engine, err := pipeline.NewEngine(ctx, opts(events.StreamEngine, events.SubjectEngineSamplesAll), wcfg, deps)
		if err != nil {
			return err
		}
		pipes = append(pipes, engine)
	}
	if cfg.Agg.Feedback {
		fb, err := pipeline.NewFeedback(ctx, opts(events.StreamFeedback, events.SubjectFeedbackAll), wcfg, cfg.Agg.FeedbackDedup, deps)
		if err != nil {
			return err
		}
		pipes = append(pipes, fb)
	}
	sweeper, err := pipeline.NewOutboxSweeper(ctx, js, db.Conn(), cfg.NATS.Streams.Replicas, reg, logger)
	if err != nil {
		return err
	}
	// The watermark tells an alerter which windows this aggregator has published.
	marks := pipeline.NewWatermarks(heldPublisher{js, held}, pub, cfg.Agg.Consumer, cfg.Agg.Window, reg, logger)
	rollups, err := js.Stream(ctx, events.StreamRollups)
	if err != nil {
		return fmt.Errorf("cannot look up stream %s: %w", events.StreamRollups, err)
	}
	if through, err := marks.Resume(ctx, rollups, time.Now()); err != nil {
		return err
	} else if !through.IsZero() {
		logger.Info("resuming from the last watermark published", "through", through)
	}
	for _, p := range pipes {
		if err := p.PublishWatermarks(ctx, marks); err != nil {
			return err
		}
	}

	current.set(pipes)
	logger.Info("aggregating", "http", srv.Addr(), "window", cfg.Agg.Window, "lateness", cfg.Agg.Lateness, "buckets", buckets.String())

	// The publisher outlives the pipelines so that the last flush's rollups go out.
	pubCtx, stopPub := context.WithCancel(held)
	pubDone := make(chan error, 1)
	go func() { pubDone <- pub.Run(pubCtx) }()
	marksDone := make(chan error, 1)
	go func() { marksDone <- marks.Run(pubCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		select {
		case err := <-srvErr:
			return err
		case <-gctx.Done():
			return nil
		}
	})
	g.Go(func() error { return sweeper.Run(gctx) })
	for _, p := range pipes {
		g.Go(func() error { return p.Run(gctx) })
	}
	err = g.Wait()
	for _, p := range pipes {
		*unsettled = *unsettled || p.Unsettled()
	}
	stopPub()
	if perr := <-pubDone; perr != nil {
		logger.Warn("rollups left unpublished at shutdown", "err", perr)
	}
	<-marksDone
	return err
}

// termPipes are the pipelines of the lease's term that counts, for the readiness checks.
type termPipes struct {
	mu    sync.Mutex
	pipes []*pipeline.Pipeline
}

func (t *termPipes) set(p []*pipeline.Pipeline) {
	t.mu.Lock()
	t.pipes = p
	t.mu.Unlock()
}

func (t *termPipes) get() []*pipeline.Pipeline {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pipes
}

// termRegisterer registers the metrics of what a term of the lease makes (the publisher, the
// outbox sweeper, the watermarks) in place of those of the term before: they count from 0
// again, as after a restart. release unregisters them once the term has ended, so that a
// process standing by exposes none of them.
type termRegisterer struct {
	prometheus.Registerer
	mu  sync.Mutex
	cur []prometheus.Collector
}

func (r *termRegisterer) Register(c prometheus.Collector) error {
	err := r.Registerer.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		r.Registerer.Unregister(dup.ExistingCollector)
		err = r.Registerer.Register(c)
	}
	if err == nil {
		r.mu.Lock()
		r.cur = append(r.cur, c)
		r.mu.Unlock()
	}
	return err
}

// release unregisters what the term registered.
func (r *termRegisterer) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.cur {
		r.Registerer.Unregister(c)
	}
	r.cur = nil
}

func (r *termRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// heldPublisher publishes the watermark only while the lease is held: one published after
// another process took over could run ahead of what that one has stored.
type heldPublisher struct {
	js   jetstream.JetStream
	held context.Context
}

func (h heldPublisher) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if h.held.Err() != nil {
		return nil, context.Cause(h.held)
	}
	return h.js.PublishMsg(ctx, m, opts...)
}

// drain flushes what the connection still holds (rollups published) and waits for
// it to close, up to a bound.
func drain(nc interface {
	Drain() error
	IsClosed() bool
}) error {
	if err := nc.Drain(); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for !nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
