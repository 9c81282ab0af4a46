package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/report"
	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// reportArgs is what the report command was asked for.
type reportArgs struct {
	json    bool
	filter  report.Filter
	main    report.Range
	compare *report.Range // the baseline ("before") range, when comparing
}

func parseReportArgs(args []string, now time.Time, loc *time.Location, stderr io.Writer) (reportArgs, error) {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "", "start of the range (2026-11-30T10:00:00Z, \"2026-11-30 10:00\" in local time, now-2h)")
	to := fs.String("to", "", "end of the range (default now)")
	last := fs.Duration("last", 0, "the range is the last this long (default 1h when --from is not set); with --change, the span on each side")
	cmpFrom := fs.String("compare-from", "", "start of the range to compare with (the \"before\")")
	cmpTo := fs.String("compare-to", "", "end of the range to compare with")
	change := fs.String("change", "", "time of a change: compare the --last (default 1h) before it with the --last after it")
	var a reportArgs
	fs.StringVar(&a.filter.Model, "model", "", "only this model")
	fs.StringVar(&a.filter.Scene, "scene", "", "only this scene")
	fs.StringVar(&a.filter.Env, "env", "", "only this env")
	fs.BoolVar(&a.json, "json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: tokenscope report [flags]\n\nThe per-bucket table from ClickHouse (CLICKHOUSE_ADDR, CLICKHOUSE_DB, CLICKHOUSE_USER,\nCLICKHOUSE_PASSWORD, CLICKHOUSE_TLS). A window belongs to a range when it starts in it.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	if fs.NArg() > 0 {
		return a, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	at := func(name, v string, def time.Time) (time.Time, error) {
		if v == "" {
			return def, nil
		}
		t, err := report.ParseTime(v, now, loc)
		if err != nil {
			return t, fmt.Errorf("--%s: %w", name, err)
		}
		return t, nil
	}
	if *last < 0 {
		return a, fmt.Errorf("--last=%s must be positive", *last)
	}
	span := *last
	if span == 0 {
		span = time.Hour
	}
	if *change != "" {
		if *from != "" || *to != "" || *cmpFrom != "" || *cmpTo != "" {
			return a, errors.New("--change sets both ranges: use it without --from, --to, --compare-from and --compare-to")
		}
		c, err := at("change", *change, now)
		if err != nil {
			return a, err
		}
		a.main = report.Range{From: c, To: c.Add(span)}
		a.compare = &report.Range{From: c.Add(-span), To: c}
		return a, nil
	}
	if *from != "" && *last != 0 {
		return a, errors.New("--from and --last both set the range's start: choose one")
	}
	end, err := at("to", *to, now)
	if err != nil {
		return a, err
	}
	start, err := at("from", *from, end.Add(-span))
	if err != nil {
		return a, err
	}
	if !start.Before(end) {
		return a, fmt.Errorf("the range is empty: --from %s is not before --to %s", start.Format(time.RFC3339), end.Format(time.RFC3339))
	}
	a.main = report.Range{From: start, To: end}
	if (*cmpFrom == "") != (*cmpTo == "") {
		return a, errors.New("--compare-from and --compare-to go together")
	}
	if *cmpFrom != "" {
		cf, err := at("compare-from", *cmpFrom, now)
		if err != nil {
			return a, err
		}
		ct, err := at("compare-to", *cmpTo, now)
		if err != nil {
			return a, err
		}
		if !cf.Before(ct) {
			return a, fmt.Errorf("the comparison range is empty: --compare-from %s is not before --compare-to %s", cf.Format(time.RFC3339), ct.Format(time.RFC3339))
		}
		a.compare = &report.Range{From: cf, To: ct}
	}
	return a, nil
}

func runReport(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	a, err := parseReportArgs(args, time.Now(), time.Local, stderr)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	db, err := chdb.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer db.Close()
	if ok, err := hasRollups(ctx, db); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("database %s at %s has no token_rollups table: is CLICKHOUSE_DB the aggregator's, and has the aggregator run?", cfg.ClickHouse.DB, cfg.ClickHouse.Addr)
	}
	cur, err := report.Query(ctx, db.Conn(), a.main, a.filter)
	if err != nil {
		return err
	}
	if a.compare == nil {
		if a.json {
			return writeJSON(stdout, cur)
		}
		return report.WriteTable(stdout, cur)
	}
	before, err := report.Query(ctx, db.Conn(), *a.compare, a.filter)
	if err != nil {
		return err
	}
	c := report.Compare(before, cur)
	if a.json {
		return writeJSON(stdout, c)
	}
	return report.WriteComparison(stdout, c)
}

func hasRollups(ctx context.Context, db *chdb.DB) (bool, error) {
	var n uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = ? AND name = 'token_rollups'", db.Name()).Scan(&n); err != nil {
		return false, fmt.Errorf("cannot list the tables of %s: %w", db.Name(), err)
	}
	return n > 0, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("cannot write JSON: %w", err)
	}
	return nil
}
