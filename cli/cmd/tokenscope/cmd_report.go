package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/report"
	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// reportArgs is what the report command was asked for.
type reportArgs struct {
	json    bool
	layers  bool // TTFT per bucket at each layer side by side
	engine  bool // the engine view instead of the per-bucket table
	filter  report.Filter
	main    report.Range
	compare *report.Range // the baseline ("before") range, when comparing
	// sqlFile, when set, is a query to run instead of the table, with the values of its
	// {name:Type} parameters in params.
	sqlFile string
	params  map[string]string
	// business asks for the business view (satisfaction, completion, cost per satisfied
	// conversation, retries) of the requests in main.
	business bool
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
	fs.Func("layer", "the layer to read: gateway (default), engine or app; layers are never summed", func(v string) error {
		for _, l := range report.Layers {
			if v == l {
				a.filter.Layer = v
				return nil
			}
		}
		return fmt.Errorf("%q is not a layer (gateway, engine, app)", v)
	})
	fs.BoolVar(&a.layers, "layers", false, "TTFT p50/p95 per bucket at each layer (app, gateway, engine) side by side")
	fs.BoolVar(&a.json, "json", false, "print JSON instead of a table")
	fs.BoolVar(&a.business, "business", false, "the business view of the range's requests: satisfaction and quality per scene and model, by TTFT band and by stall, completion and turns, cost per satisfied conversation, retries")
	fs.BoolVar(&a.engine, "engine", false, "the inference engines' view (per host × engine × model: queue, KV cache, prefix cache, preemptions, tokens/s, efficiency) instead of the per-bucket table; filters by --model only")
	fs.StringVar(&a.sqlFile, "sql", "", "run this SQL file (a query of schemas/clickhouse/queries, say) instead of the table, its {name:Type} parameters bound from --param")
	fs.Func("param", "name=value of a {name:Type} parameter of --sql, repeated; a DateTime takes the times --from takes", func(v string) error {
		name, value, ok := strings.Cut(v, "=")
		if !ok || name == "" {
			return fmt.Errorf("%q is not name=value", v)
		}
		if a.params == nil {
			a.params = map[string]string{}
		}
		if _, dup := a.params[name]; dup {
			return fmt.Errorf("%s given twice", name)
		}
		a.params[name] = value
		return nil
	})
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: tokenscope report [flags]\n       tokenscope report --business [--from/--to/--last] [--json]\n       tokenscope report --sql FILE [--param name=value]... [--json]\n\nThe per-bucket table from ClickHouse (CLICKHOUSE_ADDR, CLICKHOUSE_DB, CLICKHOUSE_USER,\nCLICKHOUSE_PASSWORD, CLICKHOUSE_TLS) at one layer (--layer, gateway by default), or with\n--layers the TTFT of every layer side by side, or with --business the business layer's\nanswers. A window belongs to a range when it starts in it.\nWith --sql, the answer of a query whose {name:Type} parameters are bound here, so that\nany server runs it, 18.16 too.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	if fs.NArg() > 0 {
		return a, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	if a.sqlFile != "" {
		var other []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "sql" && f.Name != "param" && f.Name != "json" {
				other = append(other, "--"+f.Name)
			}
		})
		if len(other) > 0 {
			return a, fmt.Errorf("--sql takes its values from --param, not %s", strings.Join(other, ", "))
		}
		return a, nil
	}
	if len(a.params) > 0 {
		return a, errors.New("--param goes with --sql")
	}
	if a.business && a.layers || a.business && a.engine || a.layers && a.engine {
		return a, errors.New("--business, --engine and --layers are views of their own: give one of them")
	}
	if a.business {
		var other []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "business", "json", "from", "to", "last", "layer":
			default:
				other = append(other, "--"+f.Name)
			}
		})
		if len(other) > 0 {
			return a, fmt.Errorf("--business takes a range (--from, --to, --last), --layer and --json, not %s", strings.Join(other, ", "))
		}
	}
	if a.layers && a.filter.Layer != "" {
		return a, errors.New("--layers reads every layer: use it without --layer")
	}
	if a.layers && (*change != "" || *cmpFrom != "" || *cmpTo != "") {
		return a, errors.New("--layers reads one range: use it without --change, --compare-from and --compare-to")
	}
	if a.engine && (a.filter.Scene != "" || a.filter.Env != "" || a.filter.Layer != "" || *cmpFrom != "" || *cmpTo != "" || *change != "") {
		return a, errors.New("--engine takes a range and --model: engines have no scene, env or layer, and the engine view has no comparison")
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
	var sql string
	if a.sqlFile != "" {
		if sql, err = readSQL(a.sqlFile, a.params, time.Now(), time.Local); err != nil {
			return err
		}
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
	if sql != "" {
		ans, err := report.Run(ctx, db.Conn(), sql)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(stdout, ans.JSON())
		}
		return report.WriteAnswer(stdout, ans)
	}
	if a.engine {
		rep, err := report.QueryEngine(ctx, db.Conn(), a.main, a.filter)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(stdout, rep)
		}
		return report.WriteEngineTable(stdout, rep)
	}
	if ok, err := hasRollups(ctx, db); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("database %s at %s has no token_rollups table: is CLICKHOUSE_DB the aggregator's, and has the aggregator run?", cfg.ClickHouse.DB, cfg.ClickHouse.Addr)
	}
	if a.business {
		b, err := report.QueryBusiness(ctx, db.Conn(), a.main, a.filter.Layer)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(stdout, b)
		}
		return report.WriteBusiness(stdout, b)
	}
	if a.layers {
		rep, err := report.QueryLayers(ctx, db.Conn(), a.main, a.filter)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(stdout, rep)
		}
		return report.WriteLayers(stdout, rep)
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

// maxSQLFile bounds the query file read.
const maxSQLFile = 1 << 20

// readSQL reads a query file and binds its {name:Type} parameters from params: every
// placeholder needs a value and every value a placeholder. A DateTime takes what --from
// takes (now-2h, 2026-11-30 10:00 in loc, RFC 3339) besides what chdb.Bind reads.
func readSQL(file string, params map[string]string, now time.Time, loc *time.Location) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("cannot read --sql: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxSQLFile+1))
	if err != nil {
		return "", fmt.Errorf("cannot read --sql: %w", err)
	}
	if len(raw) > maxSQLFile {
		return "", fmt.Errorf("--sql %s is larger than %d bytes", file, maxSQLFile)
	}
	sql := string(raw)
	values := map[string]string{}
	used := map[string]bool{}
	for _, p := range chdb.Params(sql) {
		v, ok := params[p.Name]
		if !ok {
			return "", fmt.Errorf("%s needs --param %s=… (a %s)", file, p.Name, p.Type)
		}
		used[p.Name] = true
		if p.Type == "DateTime" {
			if t, err := report.ParseTime(v, now, loc); err == nil {
				v = strconv.FormatInt(t.Unix(), 10)
			}
		}
		values[p.Name] = v
	}
	for name := range params {
		if !used[name] {
			return "", fmt.Errorf("--param %s: %s has no {%s:…} parameter", name, file, name)
		}
	}
	bound, err := chdb.Bind(sql, values)
	if err != nil {
		return "", fmt.Errorf("--sql %s: %w", file, err)
	}
	return bound, nil
}
