package report

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
)

// EngineRow is one host × engine endpoint × model over the report's range, from the
// engines' own metrics (engine_rollups), joined with the host's GPUs (gpu_rollups).
type EngineRow struct {
	Host   string `json:"host"`
	Name   string `json:"name"`   // the endpoint's name in GPUWATCH_ENGINES
	Engine string `json:"engine"` // vllm, sglang or tgi
	Model  string `json:"model"`
	// UpShare is the share of the engine's scrapes that answered.
	UpShare float64 `json:"up_share"`
	// Gauges: means over the answered scrapes, and the highest reading.
	QueueDepthAvg   float64 `json:"queue_depth_avg"`
	QueueDepthMax   float64 `json:"queue_depth_max"`
	RunningAvg      float64 `json:"running_avg"`
	KVCacheUsageAvg float64 `json:"kv_cache_usage_avg"` // 0–1
	KVCacheUsageMax float64 `json:"kv_cache_usage_max"`
	// QueueTime is the time requests waited in the engine's queue, ms, read off the engine's
	// histogram buckets summed over the range and interpolated within the bucket that holds
	// the rank (as Prometheus's histogram_quantile): as fine as the engine's buckets. N is
	// how many requests it describes; 0 leaves the percentiles undefined.
	QueueTime Percentiles `json:"queue_time_ms"`
	// PrefixHitRate is prefix-cache hits ÷ queries (tokens) over the range; for SGLang,
	// which exports only a ratio, its mean. HasPrefix is false where the engine says nothing.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	HasPrefix     bool    `json:"has_prefix"`
	Preemptions   float64 `json:"preemptions"`
	// Tokens per second of the report's span, counted by the engine.
	PromptTPS     float64 `json:"prompt_tokens_per_s"`
	GenerationTPS float64 `json:"generation_tokens_per_s"`
	// Efficiency, where the host's GPUs report: generation tokens/s ÷ the host's mean GPU
	// utilisation (%), and generation tokens per joule of its GPUs. Every engine on a host
	// shares its GPUs, so each row is divided by the whole host's figures.
	GPUUtilPct     float64 `json:"gpu_util_pct"`
	TPSPerUtilPct  float64 `json:"tokens_per_s_per_util_pct"`
	TokensPerJoule float64 `json:"tokens_per_joule"`
	HasGPU         bool    `json:"has_gpu"`
}

// EngineReport is the engine view of one range.
type EngineReport struct {
	Range  Range       `json:"range"`
	Filter Filter      `json:"filter"`
	First  time.Time   `json:"first_window,omitzero"`
	End    time.Time   `json:"end,omitzero"`
	Rows   []EngineRow `json:"rows"`
}

// Seconds is the span the report's windows cover, the denominator of its rates.
func (r EngineReport) Seconds() float64 {
	if !r.End.After(r.First) {
		return 0
	}
	return r.End.Sub(r.First).Seconds()
}

// engineWhere is the range, and the model when the filter names one (engines have no scene
// or env).
func engineWhere(r Range, f Filter) (string, map[string]string) {
	cond := "window_start >= {from:DateTime} AND window_start < {to:DateTime}"
	params := map[string]string{"from": strconv.FormatInt(r.From.Unix(), 10), "to": strconv.FormatInt(r.To.Unix(), 10)}
	if f.Model != "" {
		cond += " AND model = {model:String}"
		params["model"] = f.Model
	}
	return cond, params
}

const engineSpanSQL = `SELECT count(), min(window_start), max(window_start + window_seconds) FROM engine_rollups WHERE %s`

// engineSQL sums each engine × model over the range. Histogram bucket counts add element
// by element (sumForEach) over the rows that saw requests; the bounds' lengths tell whether
// they stayed the same. Rows an engine wrote while down have no model and only count scrapes.
const engineSQL = `
SELECT host, name, any(engine) AS kind, model,
    sum(up_samples) AS up, sum(samples) AS n_samples,
    sum(queue_depth_avg * up_samples) / greatest(sum(up_samples), 1) AS queue_avg, max(queue_depth_max) AS queue_max,
    sum(running_avg * up_samples) / greatest(sum(up_samples), 1) AS running,
    sum(kv_cache_usage_avg * up_samples) / greatest(sum(up_samples), 1) AS kv_avg, max(kv_cache_usage_max) AS kv_max,
    sum(prefix_cache_queries) AS queries, sum(prefix_cache_hits) AS hits,
    sum(cache_hit_rate_avg * up_samples) / greatest(sum(up_samples), 1) AS hit_rate_gauge, max(cache_hit_rate_avg) AS hit_rate_gauge_max,
    sum(preemptions) AS preempted, sum(prompt_tokens) AS prompt, sum(generation_tokens) AS generated,
    sum(queue_time_count) AS queue_n,
    anyIf(queue_time_le, queue_time_count > 0) AS queue_le,
    sumForEachIf(queue_time_counts, queue_time_count > 0) AS queue_counts,
    minIf(length(queue_time_le), queue_time_count > 0) AS queue_le_min,
    maxIf(length(queue_time_le), queue_time_count > 0) AS queue_le_max
FROM engine_rollups
WHERE %s
GROUP BY host, name, model
ORDER BY host, name, model`

// engineGPUSQL is each host's GPUs over the range: utilisation weighted by samples, energy.
const engineGPUSQL = `
SELECT host, sum(util_avg * samples) / greatest(sum(samples), 1) AS util, sum(energy_j) AS energy, sum(samples) AS n
FROM gpu_rollups
WHERE window_start >= {from:DateTime} AND window_start < {to:DateTime}
GROUP BY host
ORDER BY host`

// engineQueries returns the queries of the engine view with their parameters bound, and
// unbound with the values.
func engineQueries(r Range, f Filter) (bound, unbound [3]string, params map[string]string, err error) {
	cond, params := engineWhere(r, f)
	unbound = [3]string{fmt.Sprintf(engineSpanSQL, cond), fmt.Sprintf(engineSQL, cond), engineGPUSQL}
	for i, q := range unbound {
		p := params
		if i == 2 {
			p = map[string]string{"from": params["from"], "to": params["to"]}
		}
		if bound[i], err = chdb.Bind(q, p); err != nil {
			return
		}
	}
	return bound, unbound, params, nil
}

// QueryEngine reads the engine view of r (model from f) from engine_rollups and gpu_rollups.
func QueryEngine(ctx context.Context, conn driver.Conn, r Range, f Filter) (EngineReport, error) {
	if !r.From.Before(r.To) {
		return EngineReport{}, fmt.Errorf("cannot report on an empty range: from %s is not before to %s", r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	}
	rep := EngineReport{Range: Range{From: r.From.UTC(), To: r.To.UTC()}, Filter: Filter{Model: f.Model}, Rows: []EngineRow{}}
	q, _, _, err := engineQueries(r, f)
	if err != nil {
		return rep, err
	}
	var windows uint64
	var first, end time.Time
	if err := conn.QueryRow(ctx, q[0]).Scan(&windows, &first, &end); err != nil {
		return rep, fmt.Errorf("cannot read engine_rollups: %w", err)
	}
	if windows == 0 {
		return rep, nil
	}
	rep.First, rep.End = first.UTC(), end.UTC()
	secs := rep.Seconds()

	gpus := map[string][2]float64{} // host → util %, energy J
	grows, err := conn.Query(ctx, q[2])
	if err != nil {
		return rep, fmt.Errorf("cannot query gpu_rollups for the engine view: %w", err)
	}
	for grows.Next() {
		var host string
		var util, energy float64
		var n uint64
		if err := grows.Scan(&host, &util, &energy, &n); err != nil {
			grows.Close()
			return rep, fmt.Errorf("cannot read gpu_rollups for the engine view: %w", err)
		}
		if n > 0 {
			gpus[host] = [2]float64{util, energy}
		}
	}
	grows.Close()
	if err := grows.Err(); err != nil {
		return rep, fmt.Errorf("cannot read gpu_rollups for the engine view: %w", err)
	}

	rows, err := conn.Query(ctx, q[1])
	if err != nil {
		return rep, fmt.Errorf("cannot query the engine view: %w", err)
	}
	defer rows.Close()
	var all []EngineRow
	down := map[[2]string][2]uint64{} // host, name → up, samples of the rows without a model
	for rows.Next() {
		var x EngineRow
		var up, samples uint64
		var queries, hits, gauge, gaugeMax, prompt, generated, queueN float64
		var queueLe, queueCounts []float64
		var leMin, leMax uint64
		if err := rows.Scan(&x.Host, &x.Name, &x.Engine, &x.Model, &up, &samples, &x.QueueDepthAvg, &x.QueueDepthMax, &x.RunningAvg,
			&x.KVCacheUsageAvg, &x.KVCacheUsageMax, &queries, &hits, &gauge, &gaugeMax, &x.Preemptions, &prompt, &generated,
			&queueN, &queueLe, &queueCounts, &leMin, &leMax); err != nil {
			return rep, fmt.Errorf("cannot read an engine row: %w", err)
		}
		if up == 0 { // scrapes that failed: no model, nothing measured
			k := [2]string{x.Host, x.Name}
			d := down[k]
			down[k] = [2]uint64{d[0], d[1] + samples}
			continue
		}
		k := [2]string{x.Host, x.Name}
		d := down[k]
		down[k] = [2]uint64{d[0] + up, d[1] + samples}
		switch {
		case queries > 0:
			x.PrefixHitRate, x.HasPrefix = hits/queries, true
		case gaugeMax > 0:
			x.PrefixHitRate, x.HasPrefix = gauge, true
		}
		if queueN > 0 && leMin == leMax {
			x.QueueTime.N = uint64(math.Round(queueN))
			for _, p := range []struct {
				q   float64
				dst *float64
			}{{0.5, &x.QueueTime.P50}, {0.95, &x.QueueTime.P95}, {0.99, &x.QueueTime.P99}} {
				if v := events.HistogramQuantile(p.q, queueLe, queueCounts); !math.IsNaN(v) {
					*p.dst = v * 1000
				}
			}
		}
		if secs > 0 {
			x.PromptTPS, x.GenerationTPS = prompt/secs, generated/secs
		}
		if g, ok := gpus[x.Host]; ok {
			x.HasGPU, x.GPUUtilPct = true, g[0]
			if g[0] > 0 {
				x.TPSPerUtilPct = x.GenerationTPS / g[0]
			}
			if g[1] > 0 {
				x.TokensPerJoule = generated / g[1]
			}
		}
		all = append(all, x)
	}
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("cannot read the engine view: %w", err)
	}
	for _, x := range all {
		if d := down[[2]string{x.Host, x.Name}]; d[1] > 0 {
			x.UpShare = float64(d[0]) / float64(d[1])
		}
		rep.Rows = append(rep.Rows, x)
	}
	return rep, nil
}

// EngineHeading says what an engine report covers, in one line.
func EngineHeading(r EngineReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "engines %s → %s UTC", r.Range.From.Format(time.DateTime), r.Range.To.Format(time.DateTime))
	if r.Filter.Model != "" {
		fmt.Fprintf(&b, ", model=%s", Text(r.Filter.Model))
	}
	if s := r.Seconds(); s > 0 {
		fmt.Fprintf(&b, " (windows cover %s)", time.Duration(s)*time.Second)
	}
	return b.String()
}

// WriteEngineTable writes the engine view of r as aligned text.
func WriteEngineTable(w io.Writer, r EngineReport) error {
	if len(r.Rows) == 0 {
		_, err := fmt.Fprintf(w, "%s\nno engine data in this range (gpuwatch reads engines listed in GPUWATCH_ENGINES)\n", EngineHeading(r))
		return err
	}
	fmt.Fprintf(w, "%s\n", EngineHeading(r))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "host\tengine\tmodel\tup\tqueue avg\tmax\tqueue p95\trunning\tKV avg\tKV max\tprefix hit\tpreempt\tprompt tok/s\tgen tok/s\tGPU util\ttok/s per %\ttok/J\t")
	for _, x := range r.Rows {
		prefix, gpu, eff, tpj := "-", "-", "-", "-"
		if x.HasPrefix {
			prefix = pct(x.PrefixHitRate)
		}
		if x.HasGPU {
			gpu = strconv.FormatFloat(x.GPUUtilPct, 'f', 1, 64) + "%"
			if x.GPUUtilPct > 0 {
				eff = num(x.TPSPerUtilPct)
			}
			if x.TokensPerJoule > 0 {
				tpj = num(x.TokensPerJoule)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			Text(x.Host), Text(x.Name), Text(x.Model), pct(x.UpShare), num(x.QueueDepthAvg), num(x.QueueDepthMax), ms(x.QueueTime.N, x.QueueTime.P95),
			num(x.RunningAvg), pct(x.KVCacheUsageAvg), pct(x.KVCacheUsageMax), prefix, strconv.FormatFloat(x.Preemptions, 'f', 0, 64),
			num(x.PromptTPS), num(x.GenerationTPS), gpu, eff, tpj)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write the engine table: %w", err)
	}
	_, err := fmt.Fprintln(w, "from the engines' own metrics; queue p95 in ms, interpolated within the engine's histogram buckets (as fine as they are);"+
		" prefix hit = cached ÷ looked-up prompt tokens; tok/s per % = generation tokens/s ÷ the host's mean GPU utilisation; tok/J per joule of its GPUs")
	return err
}
