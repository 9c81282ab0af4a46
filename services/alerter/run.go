package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/tokenscope/tokenscope/services/alerter/internal/checkpoint"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/history"
	"github.com/tokenscope/tokenscope/services/alerter/internal/intake"
	"github.com/tokenscope/tokenscope/services/alerter/internal/notify"
	"github.com/tokenscope/tokenscope/services/alerter/internal/record"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// run starts the alerter and serves until ctx ends.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := parseConfig(getenv)
	if err != nil {
		return err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel)) // validated
	logger := ops.NewLogger(stdout, level, "alerter")

	rs, err := rules.Load(cfg.Rules)
	if err != nil {
		return err
	}
	bopts, err := cfg.BaselineOptions()
	if err != nil {
		return err
	}
	eng, err := engine.New(rs, bopts, cfg.Resend)
	if err != nil {
		return err
	}

	srv := ops.NewServer(cfg.HTTPAddr, logger)
	srv.LimitConns(ops.NewConnLimit(ops.DefaultMaxConns, "alerter", srv.Registry())) // probes and scrapes need a handful
	if err := srv.Listen(); err != nil {
		return err
	}
	reg := srv.Registry()

	nc, err := bus.Connect(cfg.NATS, "tokenscope-alerter", logger)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("cannot use JetStream: %w", err)
	}
	if err := bus.EnsureStreams(ctx, js, cfg.NATS.Streams, events.StreamRollups, events.StreamAlerts); err != nil {
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

	now := time.Now()
	restored, err := history.RestoreAlerts(ctx, js, now.Add(-cfg.RestoreLookback))
	if err != nil {
		return err
	}
	eng.Restore(restored)
	since := now.Add(-time.Duration(cfg.BaselineDays)*24*time.Hour - cfg.Slot)
	loaded, err := history.LoadBaselines(ctx, db.Conn(), eng, since, now.Add(time.Minute), cfg.BaselineStep, bopts.Location)
	if err != nil {
		return err
	}
	engineCells, engineThrough, err := history.LoadEngineBaselines(ctx, db.Conn(), eng, since, now.Add(time.Minute), cfg.BaselineStep, bopts.Location)
	if err != nil {
		return err
	}
	sceneCells, sceneThrough, err := history.LoadBusinessBaselines(ctx, db.Conn(), eng, rs, since, now.Add(time.Minute), cfg.BaselineStep, bopts.Location)
	if err != nil {
		return err
	}
	through := maxTime(maxTime(loaded.Through, engineThrough), sceneThrough)
	eng.SetLearnedThrough(through)
	logger.Info("state restored", "rules", rs.Source, "firing_alerts", len(restored),
		"series_cells", loaded.SeriesCells, "host_cells", loaded.HostCells, "engine_cells", engineCells,
		"scene_cells", sceneCells, "baseline_through", through)

	// The checkpoint says which windows an earlier run delivered; the consumer starts again
	// from its ack floor, so the windows it held unacknowledged are read again first.
	cp, err := checkpoint.Open(ctx, js, cfg.Consumer, cfg.NATS.Streams.Replicas)
	if err != nil {
		return err
	}
	evaluated, err := cp.Load(ctx, time.Now())
	if errors.Is(err, checkpoint.ErrInvalid) {
		logger.Warn("ignoring a checkpoint that is unreadable or ahead of the clock; windows past the ack floor are evaluated again", "err", err)
	} else if err != nil {
		return err
	}
	rollupsCfg := bus.ConsumerConfig{
		Stream:        events.StreamRollups,
		Durable:       cfg.Consumer,
		FilterSubject: events.SubjectRollupsAll,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.Settle + cfg.WatermarkTimeout + 2*time.Minute,
		MaxAckPending: cfg.MaxAckPending,
		DeliverPolicy: jetstream.DeliverNewPolicy,
	}
	cons, replayed, err := intake.ResumeConsumer(ctx, js, rollupsCfg)
	if err != nil {
		return err
	}
	// A consumer gone while the alerter runs (deleted, or with its stream) is made again.
	reopener, err := intake.NewReopener(ctx, js, rollupsCfg, cfg.NATS.Streams, events.StreamAlerts)
	if err != nil {
		return err
	}
	logger.Info("consumer resumed", "consumer", cfg.Consumer, "evaluated_through", evaluated, "redelivered_through_seq", replayed)

	var am *notify.Alertmanager
	if cfg.AlertmanagerURL != "" {
		am = notify.NewAlertmanager(cfg.AlertmanagerURL, cfg.AlertmanagerTimeout, cfg.Resend, reg, logger)
	}
	sink := notify.New(js, am, reg, logger)
	// The alerts table is written from the ALERTS stream, acknowledged only once stored, so
	// a ClickHouse outage delays rows and loses none.
	rowsCfg := bus.ConsumerConfig{
		Stream:        events.StreamAlerts,
		Durable:       cfg.RowsConsumer,
		FilterSubject: events.SubjectAlertsAll,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       time.Minute,
		MaxAckPending: 10_000,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	rowsCons, _, err := intake.ResumeConsumer(ctx, js, rowsCfg)
	if err != nil {
		return err
	}
	// A consumer gone with its stream is made again once the stream is back; every row it
	// replays is one the table has or lacks, by key.
	reopen := func(ctx context.Context) (jetstream.Consumer, error) { return bus.EnsureConsumer(ctx, js, rowsCfg) }
	rec := record.New(rowsCons, record.NewStore(db.Conn()), nc, record.Options{Reopen: reopen}, reg, logger)
	in := intake.New(cons, eng, sink, cp, nc, intake.Options{Settle: cfg.Settle, WatermarkTimeout: cfg.WatermarkTimeout, Evaluated: evaluated, Replayed: replayed, Reopen: reopener.Reopen}, reg, logger)
	registerEngineMetrics(reg, eng)

	srv.AddCheck("nats", func(context.Context) error {
		if nc.Status() != nats.CONNECTED {
			return fmt.Errorf("NATS is %s", nc.Status())
		}
		return nil
	})
	srv.AddCheck("clickhouse", db.Ping)
	srv.AddCheck("rollups", func(context.Context) error {
		if !in.Reading() {
			return errors.New("the ROLLUPS consumer is not delivering (being made again)")
		}
		return nil
	})

	// Alertmanager and the alerts table outlive the intake, so what its last window sends
	// still goes out. The intake publishes to JetStream itself, waiting for each
	// acknowledgement.
	outCtx, stopOut := context.WithCancel(context.Background())
	defer stopOut()
	out, _ := errgroup.WithContext(outCtx)
	out.Go(func() error { return rec.Run(outCtx) })
	if am != nil {
		out.Go(func() error { return am.Run(outCtx) })
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Run(gctx, 5*time.Second) })
	g.Go(func() error { return in.Run(gctx) })
	logger.Info("alerter started", "http", srv.Addr(), "nats", nc.ConnectedUrlRedacted(), "clickhouse", cfg.ClickHouse.Addr)
	err = g.Wait()
	stopOut()
	if oerr := out.Wait(); oerr != nil {
		err = errors.Join(err, oerr)
	}
	// What this run read, evaluated and sent, its last window included.
	logger.Info("alerter stopped", srv.Totals("alerter_rollups_received_total", "alerter_windows_evaluated_total",
		"alerter_alerts_sent_total", "alerter_windows_undelivered")...)
	return err
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// registerEngineMetrics exposes the engine's counts as of its latest window.
func registerEngineMetrics(reg prometheus.Registerer, eng *engine.Engine) {
	counter := func(name, help string, f func(engine.Counts) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "alerter", Name: name, Help: help},
			func() float64 { return float64(f(eng.Snapshot())) })
	}
	gauge := func(name, help string, f func(engine.Counts) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "alerter", Name: name, Help: help},
			func() float64 { return float64(f(eng.Snapshot())) })
	}
	reg.MustRegister(
		counter("series_evaluations_total", "Series × window evaluations.", func(c engine.Counts) uint64 { return c.Series }),
		counter("host_evaluations_total", "Host × window efficiency evaluations.", func(c engine.Counts) uint64 { return c.Hosts }),
		counter("engine_evaluations_total", "Inference engine × model × window evaluations.", func(c engine.Counts) uint64 { return c.Engines }),
		counter("dynamic_checks_total", "Metric checks decided by a dynamic threshold.", func(c engine.Counts) uint64 { return c.Dynamic }),
		counter("static_fallback_checks_total", "Metric checks decided by a static SLA rule because the dynamic one lacked baseline or traffic.", func(c engine.Counts) uint64 { return c.StaticFallback }),
		counter("scene_evaluations_total", "Env × scene × window satisfaction and completion-rate evaluations.", func(c engine.Counts) uint64 { return c.Scenes }),
		counter("hosts_without_gpu_total", "Instances with traffic but no GPU rollup in the window (no efficiency figure).", func(c engine.Counts) uint64 { return c.HostsWithoutGPU }),
		gauge("baseline_series", "Token series with a baseline.", func(c engine.Counts) int { return c.BaselineSeries }),
		gauge("baseline_hosts", "Hosts with an efficiency baseline.", func(c engine.Counts) int { return c.BaselineHosts }),
		gauge("baseline_engines", "Inference engine × model series with a baseline.", func(c engine.Counts) int { return c.BaselineEngines }),
		gauge("baseline_scenes", "Env × scene series with a satisfaction or completion-rate baseline.", func(c engine.Counts) int { return c.BaselineScenes }),
		counter("baseline_series_refused_total", "New series (token, host, engine or scene) whose history was not kept because its baseline store held ALERTER_MAX_SERIES: their dynamic rules fall back to the static ones.", func(c engine.Counts) uint64 { return c.BaselineRefused }),
		gauge("alerts_firing", "Alerts firing.", func(c engine.Counts) int { return c.Firing }),
		gauge("alerts_pending", "Alerts pending (breaching, not yet for long enough).", func(c engine.Counts) int { return c.Pending }),
	)
}
