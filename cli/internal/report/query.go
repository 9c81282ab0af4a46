package report

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// Filter narrows a report; an empty field matches everything but the layer: a report
// reads one layer, the gateway's unless Layer says otherwise, since the same requests seen
// at two layers must never be summed.
type Filter struct {
	Model string `json:"model,omitempty"`
	Scene string `json:"scene,omitempty"`
	Env   string `json:"env,omitempty"`
	Layer string `json:"layer,omitempty"`
}

// DefaultLayer is the layer a report reads when the filter names none.
const DefaultLayer = "gateway"

// layer returns the layer f reads.
func (f Filter) layer() string {
	if f.Layer == "" {
		return DefaultLayer
	}
	return f.Layer
}

// Range is a half-open time range [From, To): a window belongs to it when its start does.
type Range struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Percentiles are latency percentiles in milliseconds, merged over every request of a row.
// N is how many requests they describe; with N = 0 they are undefined (zero).
type Percentiles struct {
	N   uint64  `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
}

// Row is one model × scene × input bucket over the report's range.
type Row struct {
	Model        string      `json:"model"`
	Scene        string      `json:"scene"`
	Bucket       string      `json:"bucket"`
	BucketLo     uint32      `json:"bucket_lo"`
	Requests     uint64      `json:"requests"`
	OK           uint64      `json:"ok"`
	Errors       uint64      `json:"errors"`
	Timeouts     uint64      `json:"timeouts"`
	Canceled     uint64      `json:"canceled"`
	InputTokens  uint64      `json:"input_tokens"`
	OutputTokens uint64      `json:"output_tokens"`
	TTFT         Percentiles `json:"ttft_ms"`
	TPOT         Percentiles `json:"tpot_ms"`
	// OutputTPS is output tokens per second over the report's observed span.
	OutputTPS   float64 `json:"output_tokens_per_s"`
	ErrorRate   float64 `json:"error_rate"`
	TimeoutRate float64 `json:"timeout_rate"`
}

// Report is the per-bucket table of one range.
type Report struct {
	Range  Range  `json:"range"`
	Filter Filter `json:"filter"`
	// First and End bound the windows found: rates are per second of [First, End).
	First time.Time `json:"first_window,omitzero"`
	End   time.Time `json:"end,omitzero"`
	Rows  []Row     `json:"rows"`
}

// Seconds is the span the report's windows cover, the denominator of its rates.
func (r Report) Seconds() float64 {
	if !r.End.After(r.First) {
		return 0
	}
	return r.End.Sub(r.First).Seconds()
}

// where returns the condition shared by every part of the query, with {name:Type}
// parameters, and their values.
func where(r Range, f Filter) (string, map[string]string) {
	cond, params := whereLabels(r, f)
	params["layer"] = f.layer()
	return cond + " AND layer = {layer:String}", params
}

// whereLabels is where without the layer, for a query that names its layers itself.
func whereLabels(r Range, f Filter) (string, map[string]string) {
	var b strings.Builder
	b.WriteString("window_start >= {from:DateTime} AND window_start < {to:DateTime}")
	params := map[string]string{"from": strconv.FormatInt(r.From.Unix(), 10), "to": strconv.FormatInt(r.To.Unix(), 10)}
	for _, c := range []struct{ col, v string }{{"model", f.Model}, {"scene", f.Scene}, {"env", f.Env}} {
		if c.v != "" {
			fmt.Fprintf(&b, " AND %[1]s = {%[1]s:String}", c.col)
			params[c.col] = c.v
		}
	}
	return b.String(), params
}

// tableSQL is the cookbook's percentiles_by_bucket.sql with counts, tokens and the sample
// count of each digest added: one digest per row and metric, quantilesTDigestWeighted over
// the centroid arrays, which 18.16 and current servers both run.
const tableSQL = `
SELECT model, scene, bucket, lo, n_requests, n_ok, n_errors, n_timeouts, n_canceled, in_tokens, out_tokens,
    ttft_n, toFloat64(ttft[1]) AS ttft_p50, toFloat64(ttft[2]) AS ttft_p95, toFloat64(ttft[3]) AS ttft_p99,
    tpot_n, toFloat64(tpot[1]) AS tpot_p50, toFloat64(tpot[2]) AS tpot_p95, toFloat64(tpot[3]) AS tpot_p99
FROM
(
    SELECT model, scene, bucket, min(bucket_lo) AS lo, sum(requests) AS n_requests, sum(ok) AS n_ok,
        sum(errors) AS n_errors, sum(timeouts) AS n_timeouts, sum(canceled) AS n_canceled,
        sum(input_tokens) AS in_tokens, sum(output_tokens) AS out_tokens,
        sum(arraySum(ttft_weights)) AS ttft_n,
        quantilesTDigestWeightedArray(0.50, 0.95, 0.99)(ttft_means, ttft_weights) AS ttft,
        sum(arraySum(tpot_weights)) AS tpot_n,
        quantilesTDigestWeightedArray(0.50, 0.95, 0.99)(tpot_means, tpot_weights) AS tpot
    FROM token_rollups
    WHERE %s
    GROUP BY model, scene, bucket
)
ORDER BY model, scene, lo`

const spanSQL = `SELECT count(), min(window_start), max(window_start + window_seconds) FROM token_rollups WHERE %s`

// queries returns the two queries a report sends, with their parameters bound, and the
// same queries with {name:Type} placeholders and the values for them.
func queries(r Range, f Filter) (span, table string, unbound [2]string, params map[string]string, err error) {
	cond, params := where(r, f)
	unbound = [2]string{fmt.Sprintf(spanSQL, cond), fmt.Sprintf(tableSQL, cond)}
	if span, err = chdb.Bind(unbound[0], params); err != nil {
		return
	}
	table, err = chdb.Bind(unbound[1], params)
	return
}

// Query reads the per-bucket table of r under f from token_rollups.
func Query(ctx context.Context, conn driver.Conn, r Range, f Filter) (Report, error) {
	if !r.From.Before(r.To) {
		return Report{}, fmt.Errorf("cannot report on an empty range: from %s is not before to %s", r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	}
	f.Layer = f.layer()
	rep := Report{Range: Range{From: r.From.UTC(), To: r.To.UTC()}, Filter: f, Rows: []Row{}}
	span, table, _, _, err := queries(r, f)
	if err != nil {
		return rep, err
	}

	var windows uint64
	var first, end time.Time
	if err := conn.QueryRow(ctx, span).Scan(&windows, &first, &end); err != nil {
		return rep, fmt.Errorf("cannot read token_rollups: %w", err)
	}
	if windows == 0 {
		return rep, nil
	}
	rep.First, rep.End = first.UTC(), end.UTC()

	rows, err := conn.Query(ctx, table)
	if err != nil {
		return rep, fmt.Errorf("cannot query the per-bucket table: %w", err)
	}
	defer rows.Close()
	secs := rep.Seconds()
	for rows.Next() {
		var x Row
		if err := rows.Scan(&x.Model, &x.Scene, &x.Bucket, &x.BucketLo, &x.Requests, &x.OK, &x.Errors, &x.Timeouts, &x.Canceled,
			&x.InputTokens, &x.OutputTokens, &x.TTFT.N, &x.TTFT.P50, &x.TTFT.P95, &x.TTFT.P99,
			&x.TPOT.N, &x.TPOT.P50, &x.TPOT.P95, &x.TPOT.P99); err != nil {
			return rep, fmt.Errorf("cannot read a per-bucket row: %w", err)
		}
		for _, p := range []*Percentiles{&x.TTFT, &x.TPOT} {
			if p.N == 0 { // nan from a digest of nothing
				p.P50, p.P95, p.P99 = 0, 0, 0
			}
		}
		if x.Requests > 0 {
			x.ErrorRate = float64(x.Errors) / float64(x.Requests)
			x.TimeoutRate = float64(x.Timeouts) / float64(x.Requests)
		}
		if secs > 0 {
			x.OutputTPS = float64(x.OutputTokens) / secs
		}
		rep.Rows = append(rep.Rows, x)
	}
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("cannot read the per-bucket table: %w", err)
	}
	return rep, nil
}
