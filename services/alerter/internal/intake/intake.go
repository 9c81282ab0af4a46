package intake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
)

// Evaluator is what the intake feeds; *engine.Engine is one.
type Evaluator interface {
	Evaluate(w engine.Window) []events.Alert
}

// Sink sends a window's alert state changes; *notify.Notifier is one.
type Sink interface {
	Send(ctx context.Context, alerts []events.Alert) error
}

// DeadLetter takes a message no consumer can use; a *nats.Conn is one.
type DeadLetter interface {
	PublishMsg(m *nats.Msg) error
}

// Options tune the intake.
type Options struct {
	Settle time.Duration // quiet time after a window's last rollup before it is evaluated
	Tick   time.Duration // how often ready windows are looked for (default 1 s)
}

// The reasons a rollup is not evaluated.
const (
	reasonMalformed  = "malformed"
	reasonInvalid    = "invalid"
	reasonSubject    = "unknown_subject"
	reasonLate       = "late"
	reasonCorrection = "correction"
)

var reasons = []string{reasonMalformed, reasonInvalid, reasonSubject, reasonLate, reasonCorrection}

// Intake gathers windows and has them evaluated, from one goroutine (Run).
type Intake struct {
	cons   jetstream.Consumer
	eval   Evaluator
	sink   Sink
	dead   DeadLetter
	opts   Options
	logger *slog.Logger

	pending   map[int64]*pendingWindow
	evaluated time.Time // start of the latest window evaluated

	received  *prometheus.CounterVec
	skipped   *prometheus.CounterVec
	windows   prometheus.Counter
	evalTime  prometheus.Histogram
	ackErrors prometheus.Counter
	lastEval  prometheus.Gauge
}

type pendingWindow struct {
	w       engine.Window
	msgs    []jetstream.Msg
	arrived time.Time
}

// New returns an intake reading cons. Its metrics are registered on reg.
func New(cons jetstream.Consumer, eval Evaluator, sink Sink, dead DeadLetter, opts Options, reg prometheus.Registerer, logger *slog.Logger) *Intake {
	if opts.Tick <= 0 {
		opts.Tick = time.Second
	}
	in := &Intake{
		cons: cons, eval: eval, sink: sink, dead: dead, opts: opts,
		logger:  logger.With("component", "intake"),
		pending: make(map[int64]*pendingWindow),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "rollups_received_total", Help: "Rollups read from the ROLLUPS stream, by kind (tokens, gpu).",
		}, []string{"kind"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "alerter", Name: "rollups_skipped_total",
			Help: "Rollups not evaluated, by reason: malformed or invalid (dead-lettered), unknown_subject, late (their window was evaluated already), correction.",
		}, []string{"reason"}),
		windows: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "alerter", Name: "windows_evaluated_total", Help: "Windows evaluated.",
		}),
		evalTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "alerter", Name: "evaluation_seconds", Help: "Time to evaluate one window.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		ackErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "alerter", Name: "ack_errors_total", Help: "Rollups whose ack failed (they will be redelivered).",
		}),
		lastEval: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "alerter", Name: "last_evaluated_window_timestamp_seconds", Help: "Start of the latest window evaluated.",
		}),
	}
	in.received.WithLabelValues("tokens")
	in.received.WithLabelValues("gpu")
	for _, r := range reasons {
		in.skipped.WithLabelValues(r)
	}
	reg.MustRegister(in.received, in.skipped, in.windows, in.evalTime, in.ackErrors, in.lastEval)
	return in
}

// Run consumes until ctx ends: it stops intake (drains the subscription), evaluates the
// windows whose settle time has passed, and leaves the rest unacknowledged for the next
// start.
func (in *Intake) Run(ctx context.Context) error {
	msgs := make(chan jetstream.Msg, 4096)
	done := make(chan struct{})
	cc, err := in.cons.Consume(func(m jetstream.Msg) {
		select {
		case msgs <- m:
		case <-done: // shutting down: left unacknowledged, redelivered after restart
		}
	}, jetstream.PullMaxMessages(1024))
	if err != nil {
		return fmt.Errorf("cannot consume rollups: %w", err)
	}
	tick := time.NewTicker(in.opts.Tick)
	defer tick.Stop()
	for {
		select {
		case m := <-msgs:
			in.Add(m, time.Now())
		case now := <-tick.C:
			in.Flush(ctx, now)
		case <-ctx.Done():
			cc.Drain()
			close(done)
			select {
			case <-cc.Closed():
			case <-time.After(5 * time.Second):
			}
			return nil
		}
	}
}

// Add takes one rollup message that arrived at now.
func (in *Intake) Add(m jetstream.Msg, now time.Time) {
	subj := m.Subject()
	var start time.Time
	var seconds int
	var addTo func(*engine.Window)
	switch {
	case strings.HasPrefix(subj, "rollup.tokens."):
		in.received.WithLabelValues("tokens").Inc()
		var r events.TokenRollup
		if err := decode(m.Data(), &r); err != nil {
			in.reject(m, reasonMalformed, err)
			return
		}
		if err := checkToken(&r); err != nil {
			in.reject(m, reasonInvalid, err)
			return
		}
		if r.Kind == events.KindCorrection {
			in.skip(m, reasonCorrection)
			return
		}
		start, seconds = r.WindowStart, r.WindowSeconds
		addTo = func(w *engine.Window) { w.Tokens = append(w.Tokens, r) }
	case strings.HasPrefix(subj, "rollup.gpu."):
		in.received.WithLabelValues("gpu").Inc()
		var r events.GPURollup
		if err := decode(m.Data(), &r); err != nil {
			in.reject(m, reasonMalformed, err)
			return
		}
		if err := checkGPU(&r); err != nil {
			in.reject(m, reasonInvalid, err)
			return
		}
		if r.Kind == events.KindCorrection {
			in.skip(m, reasonCorrection)
			return
		}
		start, seconds = r.WindowStart, r.WindowSeconds
		addTo = func(w *engine.Window) { w.GPUs = append(w.GPUs, r) }
	default:
		in.skip(m, reasonSubject)
		return
	}
	if !start.After(in.evaluated) {
		in.skip(m, reasonLate)
		return
	}
	key := start.Unix()
	p := in.pending[key]
	if p == nil {
		p = &pendingWindow{w: engine.Window{Start: start.UTC(), Seconds: seconds}}
		in.pending[key] = p
	}
	p.w.Seconds = max(p.w.Seconds, seconds)
	addTo(&p.w)
	p.msgs = append(p.msgs, m)
	p.arrived = now
}

// Flush evaluates, oldest first, the windows whose last rollup arrived at least Settle
// before now, sends their alerts and acknowledges their messages. It stops at the first
// window still settling, so windows are always evaluated in order.
func (in *Intake) Flush(ctx context.Context, now time.Time) int {
	if len(in.pending) == 0 {
		return 0
	}
	keys := make([]int64, 0, len(in.pending))
	for k := range in.pending {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	n := 0
	for _, k := range keys {
		p := in.pending[k]
		if now.Sub(p.arrived) < in.opts.Settle {
			break
		}
		began := time.Now()
		alerts := in.eval.Evaluate(p.w)
		in.evalTime.Observe(time.Since(began).Seconds())
		// A failed row write is logged and counted by the sink; the alerts are published,
		// so the window is done either way.
		_ = in.sink.Send(ctx, alerts)
		for _, m := range p.msgs {
			if err := m.Ack(); err != nil {
				in.ackErrors.Inc()
			}
		}
		delete(in.pending, k)
		in.evaluated = p.w.Start
		in.windows.Inc()
		in.lastEval.Set(float64(p.w.Start.Unix()))
		n++
	}
	return n
}

// Pending returns how many windows are gathering.
func (in *Intake) Pending() int { return len(in.pending) }

func (in *Intake) skip(m jetstream.Msg, reason string) {
	in.skipped.WithLabelValues(reason).Inc()
	if err := m.Ack(); err != nil {
		in.ackErrors.Inc()
	}
}

// reject terminates a rollup no redelivery can fix and dead-letters it with its reason.
func (in *Intake) reject(m jetstream.Msg, reason string, err error) {
	in.skipped.WithLabelValues(reason).Inc()
	if in.dead != nil {
		dl := &nats.Msg{Subject: events.SubjectInvalid, Data: m.Data(), Header: nats.Header{}}
		dl.Header.Set("Tokenscope-Source", "alerter")
		dl.Header.Set("Tokenscope-Subject", m.Subject())
		dl.Header.Set("Tokenscope-Reason", reason)
		dl.Header.Set("Tokenscope-Error", err.Error())
		_ = in.dead.PublishMsg(dl)
	}
	if err := m.Term(); err != nil {
		in.ackErrors.Inc()
	}
}

var errInvalidRollup = errors.New("invalid rollup")

func decode(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("cannot decode rollup: %w", err)
	}
	return nil
}

func checkKind(kind string) error {
	if kind != events.KindWindow && kind != events.KindCorrection {
		return fmt.Errorf("%w: kind %q is neither %s nor %s", errInvalidRollup, kind, events.KindWindow, events.KindCorrection)
	}
	return nil
}

func checkToken(r *events.TokenRollup) error {
	switch {
	case r.WindowStart.IsZero():
		return fmt.Errorf("%w: window_start is missing", errInvalidRollup)
	case r.WindowSeconds <= 0:
		return fmt.Errorf("%w: window_seconds=%d must be positive", errInvalidRollup, r.WindowSeconds)
	case r.Env == "" || r.Scene == "" || r.Model == "":
		return fmt.Errorf("%w: env, scene and model are required", errInvalidRollup)
	case r.Errors+r.Timeouts > r.Requests:
		return fmt.Errorf("%w: errors %d + timeouts %d exceed requests %d", errInvalidRollup, r.Errors, r.Timeouts, r.Requests)
	}
	return checkKind(r.Kind)
}

func checkGPU(r *events.GPURollup) error {
	switch {
	case r.WindowStart.IsZero():
		return fmt.Errorf("%w: window_start is missing", errInvalidRollup)
	case r.WindowSeconds <= 0:
		return fmt.Errorf("%w: window_seconds=%d must be positive", errInvalidRollup, r.WindowSeconds)
	case r.Host == "":
		return fmt.Errorf("%w: host is required", errInvalidRollup)
	case r.UtilAvg < 0 || r.UtilAvg > 100 || r.EnergyJ < 0:
		return fmt.Errorf("%w: util_avg %v or energy_j %v out of range", errInvalidRollup, r.UtilAvg, r.EnergyJ)
	}
	return checkKind(r.Kind)
}
