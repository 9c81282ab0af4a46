package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tokenscope/tokenscope/cli/internal/report"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// keptAlerts is how many recent alerts the redrawn screen shows.
const keptAlerts = 12

// watch shows the per-bucket table of the last View every Refresh and the alerts as they
// arrive, until ctx ends or a child stops on its own.
func (s *demo) watch(ctx context.Context) error {
	nc, err := nats.Connect("nats://"+s.a.nats, nats.Name("tokenscope-demo"))
	if err != nil {
		return fmt.Errorf("cannot connect to the demo's NATS: %w", err)
	}
	defer nc.Close()
	alerts := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(events.SubjectAlertsAll, alerts)
	if err != nil {
		return fmt.Errorf("cannot subscribe to %s: %w", events.SubjectAlertsAll, err)
	}
	defer sub.Unsubscribe()

	db, err := chdb.Open(ctx, chdb.Config{Addr: s.a.ch, DB: "tokenscope", User: "default", DialTimeout: 5 * time.Second})
	if err != nil {
		return fmt.Errorf("cannot open the demo's ClickHouse: %w", err)
	}
	defer db.Close()

	failed := make(chan error, len(s.procs)+1)
	for _, p := range s.procs {
		go func() {
			select {
			case <-p.Done():
				select {
				case <-s.stopping:
				default:
					failed <- p.Failure()
				}
			case <-s.stopping:
			}
		}()
	}
	go func() {
		select {
		case <-s.ch.Done():
			failed <- fmt.Errorf("ClickHouse stopped; its log: %s", s.ch.Log)
		case <-s.stopping:
		}
	}()

	started := time.Now()
	if s.burst != nil {
		bctx, stopBurst := context.WithCancel(ctx)
		burstDone := make(chan struct{})
		go func() {
			defer close(burstDone)
			s.burst.run(bctx, started)
		}()
		defer func() {
			stopBurst()
			<-burstDone
		}()
	}
	var recent []string
	var last string
	tick := time.NewTicker(s.o.Refresh)
	defer tick.Stop()
	if !s.o.TTY {
		s.say("\nthe per-bucket table of the last %s every %s; alerts as they fire (Ctrl-C stops everything)", s.o.View, s.o.Refresh)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case m := <-alerts:
			line := alertLine(m.Data)
			recent = append(recent, line)
			if len(recent) > keptAlerts {
				recent = recent[len(recent)-keptAlerts:]
			}
			if !s.o.TTY {
				s.say("%s", line)
			}
		case now := <-tick.C:
			last = s.draw(ctx, db, now, started, recent, last)
		}
	}
}

// draw renders one frame: on a terminal the whole screen, otherwise the table alone and
// only when it differs from the last one printed (prev). It returns what it printed.
func (s *demo) draw(ctx context.Context, db *chdb.DB, now, started time.Time, recent []string, prev string) string {
	var b, table bytes.Buffer
	qctx, cancel := context.WithTimeout(ctx, s.o.Refresh)
	rep, err := report.Query(qctx, db.Conn(), report.Range{From: now.Add(-s.o.View), To: now}, report.Filter{})
	var engines report.EngineReport
	var engErr error
	if err == nil && s.gpu != "" {
		// The engine view of the last minute, so a queue shows while it builds.
		span := max(time.Minute, 3*s.o.Window)
		engines, engErr = report.QueryEngine(qctx, db.Conn(), report.Range{From: now.Add(-span), To: now}, report.Filter{})
	}
	cancel()
	if s.o.TTY {
		b.WriteString("\x1b[H\x1b[2J")
		fmt.Fprintf(&b, "tokenscope demo — up %s — gpuwatch: %s — proxy http://%s — Ctrl-C stops everything\n\n",
			now.Sub(started).Truncate(time.Second), s.gpu, s.a.emitter)
	}
	switch {
	case err != nil && ctx.Err() == nil:
		fmt.Fprintf(&table, "cannot read the table: %v\n", err)
	case err == nil && len(rep.Rows) == 0:
		fmt.Fprintf(&table, "waiting for the first windows (%s each, written once %s of lateness has passed)…\n", s.o.Window, 5*time.Second)
	case err == nil:
		_ = report.WriteTable(&table, rep)
	}
	switch {
	case engErr != nil && ctx.Err() == nil:
		fmt.Fprintf(&table, "\ncannot read the engine view: %v\n", engErr)
	case engErr == nil && len(engines.Rows) > 0:
		table.WriteString("\n")
		_ = report.WriteEngineTable(&table, engines)
	}
	if !s.o.TTY {
		// The heading moves with the clock; print when the numbers change.
		body := table.String()
		if i := strings.IndexByte(body, '\n'); i >= 0 && len(rep.Rows) > 0 {
			body = body[i+1:]
		}
		if len(engines.Rows) > 0 {
			body = strings.Replace(body, report.EngineHeading(engines), "", 1)
		}
		if body == prev {
			return prev
		}
		fmt.Fprintf(&b, "\n— %s —\n", now.Format(time.TimeOnly))
		b.Write(table.Bytes())
		_, _ = s.out.Write(b.Bytes())
		return body
	}
	b.Write(table.Bytes())
	b.WriteString("\nalerts (newest last):\n")
	if len(recent) == 0 {
		in := s.incident()
		fmt.Fprintf(&b, "  none yet: the load burst beyond the engine's batch starts %s in, for %s of every %s\n", in.At, in.For, in.Every)
	}
	for _, l := range recent {
		b.WriteString("  " + l + "\n")
	}
	fmt.Fprintf(&b, "\nlogs: %s   addresses: %s\n", s.logs, filepath.Join(s.o.Dir, "stack.env"))
	_, _ = s.out.Write(b.Bytes())
	return ""
}

// alertLine is one alert in a line: when, state, severity, rule, series, value and threshold.
func alertLine(data []byte) string {
	var a events.Alert
	if err := json.Unmarshal(data, &a); err != nil {
		return fmt.Sprintf("(an alert that does not decode: %v)", err)
	}
	// Labels are whatever the alerter was sent: each is escaped, so none breaks the line.
	var series []string
	for _, k := range []string{"env", "scene", "model", "bucket", "layer", "instance"} {
		if v := a.Labels[k]; v != "" {
			series = append(series, k+"="+report.Text(v))
		}
	}
	if len(series) == 0 {
		for _, k := range slices.Sorted(maps.Keys(a.Labels)) {
			if k != "alertname" && k != "severity" {
				series = append(series, report.Text(k)+"="+report.Text(a.Labels[k]))
			}
		}
	}
	line := fmt.Sprintf("%s %-8s %-8s %-22s %s  value %s threshold %s",
		a.At.Local().Format(time.TimeOnly), report.Text(strings.ToUpper(a.State)), report.Text(a.Severity), report.Text(a.Rule), strings.Join(series, " "), value(a.Value), value(a.Threshold))
	if c := a.EngineCause; c != nil && a.State == events.AlertFiring {
		line += fmt.Sprintf("  ← %s (engine %s/%s: queue p95 %s ms vs %s, prefill p95 %s ms vs %s)",
			causeWords[c.Cause], report.Text(c.Host), report.Text(c.Engine), value(c.QueueP95Ms), value(c.QueueRefMs), value(c.PrefillP95Ms), value(c.PrefillRefMs))
	}
	return line
}

var causeWords = map[string]string{
	events.CauseQueueTime:   "queue time grew",
	events.CausePrefillTime: "prefill time grew",
	events.CauseNeither:     "neither queue nor prefill time grew",
}

// value prints latencies (ms) whole and rates with three significant digits.
func value(v float64) string {
	if v >= 100 || v <= -100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
