package history

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// Baselines takes cells loaded from ClickHouse; *engine.Engine is one.
type Baselines interface {
	MergeSeries(key engine.SeriesKey, t time.Time, m rules.Metric, n uint64, mean, variance float64, sample []float64)
	MergeHost(host string, t time.Time, m rules.Metric, n uint64, mean, variance float64, sample []float64)
}

// Loaded says what LoadBaselines read.
type Loaded struct {
	SeriesCells, HostCells int
	Through                time.Time // start of the latest window read
}

// The per-window values of each token series, in the order of rules' series metrics.
// Percentiles merge the centroids of every row of the window (instances and corrections)
// with quantileTDigestWeighted, which 18.16 has; toFloat64 because it answers Float32 there.
const seriesWindows = `
SELECT window_start, env, scene, model, bucket, layer,
    sum(requests) AS req,
    toFloat64(quantileTDigestWeightedArrayIf(0.95)(ttft_means, ttft_weights, ttft_count > 0)) AS ttft,
    toFloat64(quantileTDigestWeightedArrayIf(0.95)(tpot_means, tpot_weights, tpot_count > 0)) AS tpot,
    toFloat64(quantileTDigestWeightedArrayIf(0.99)(total_means, total_weights, total_count > 0)) AS total,
    sum(ttft_count) AS ttft_n, sum(tpot_count) AS tpot_n, sum(total_count) AS total_n,
    sum(errors) / req AS err_rate, sum(timeouts) / req AS tmo_rate,
    sum(output_tokens) / max(window_seconds) AS tps
FROM token_rollups
WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d)
GROUP BY window_start, env, scene, model, bucket, layer
HAVING req > 0`

// Then per baseline step: count, mean, population variance and a few values of each.
const seriesCells = `
SELECT env, scene, model, bucket, layer, %s AS step, max(window_start) AS last,
    countIf(ttft_n > 0), avgIf(ttft, ttft_n > 0), varPopIf(ttft, ttft_n > 0), groupArrayIf(3)(ttft, ttft_n > 0),
    countIf(tpot_n > 0), avgIf(tpot, tpot_n > 0), varPopIf(tpot, tpot_n > 0), groupArrayIf(3)(tpot, tpot_n > 0),
    countIf(total_n > 0), avgIf(total, total_n > 0), varPopIf(total, total_n > 0), groupArrayIf(3)(total, total_n > 0),
    count(), avg(err_rate), varPop(err_rate), groupArray(3)(err_rate),
    count(), avg(tmo_rate), varPop(tmo_rate), groupArray(3)(tmo_rate),
    count(), avg(tps), varPop(tps), groupArray(3)(tps)
FROM (` + seriesWindows + `)
GROUP BY env, scene, model, bucket, layer, step`

// Hosts: output tokens of an instance's token rows joined with its host's GPU rows per
// window, at the gateway layer only (the engine's view of the same requests would count
// them twice); utilisation weighted by samples over GPUs and corrections. Current servers require
// the joined subqueries to be named.
const hostCells = `
SELECT host, %s AS step, max(window_start) AS last,
    countIf(util > 0), avgIf(tps / util, util > 0), varPopIf(tps / util, util > 0), groupArrayIf(3)(tps / util, util > 0),
    countIf(energy > 0), avgIf(out / energy, energy > 0), varPopIf(out / energy, energy > 0), groupArrayIf(3)(out / energy, energy > 0)
FROM (
    SELECT window_start, host, out, tps, util, energy FROM (
        SELECT window_start, instance AS host, sum(output_tokens) AS out, sum(output_tokens) / max(window_seconds) AS tps
        FROM token_rollups
        WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d) AND instance != '' AND layer = 'gateway'
        GROUP BY window_start, host
        HAVING sum(requests) > 0
    ) AS tokens ALL INNER JOIN (
        SELECT window_start, host,
            sum(util_avg * greatest(samples, 1)) / sum(greatest(samples, 1)) AS util, sum(energy_j) AS energy
        FROM gpu_rollups
        WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d)
        GROUP BY window_start, host
    ) AS gpus USING (window_start, host)
)
GROUP BY host, step`

// stepExpr is the SQL of the start of the baseline step holding window_start: a step of
// the time of day in loc, as the engine learns windows into (baseline.Store.StepOf). Where
// loc's offset from UTC is no multiple of the step (India, +05:30, with hour steps) the
// steps start that far past a multiple of it in UTC. The offset is loc's at `at`: a change
// of offset for summer time by a multiple of the step (an hour, as nearly everywhere)
// moves no step.
func stepExpr(step time.Duration, loc *time.Location, at time.Time) string {
	sec, shift := stepShift(step, loc, at)
	return fmt.Sprintf("toUInt32(intDiv(toUInt32(window_start) + %d, %d) * %d - %d)", shift, sec, sec, shift)
}

// stepShift returns the step in seconds and how far, in seconds, a step of the time of day
// in loc starts before a multiple of it in UTC.
func stepShift(step time.Duration, loc *time.Location, at time.Time) (sec, shift int64) {
	sec = int64(step / time.Second)
	_, off := at.In(loc).Zone()
	return sec, (int64(off)%sec + sec) % sec
}

type stat struct {
	n      uint64
	mean   float64
	vari   float64
	sample []float64
}

// LoadBaselines reads the cells of windows starting in [since, until) into b, in steps of
// the time of day in loc.
func LoadBaselines(ctx context.Context, conn driver.Conn, b Baselines, since, until time.Time, step time.Duration, loc *time.Location) (Loaded, error) {
	var out Loaded
	steps := stepExpr(step, loc, until)
	q := fmt.Sprintf(seriesCells, steps, since.Unix(), until.Unix())
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return out, fmt.Errorf("cannot query token_rollups for baselines: %w", err)
	}
	for rows.Next() {
		var key engine.SeriesKey
		var stepStart uint32
		var last time.Time
		var st [rules.NumSeriesMetrics]stat
		var layer string
		dest := []any{&key.Env, &key.Scene, &key.Model, &key.Bucket, &layer, &stepStart, &last}
		for i := range st {
			dest = append(dest, &st[i].n, &st[i].mean, &st[i].vari, &st[i].sample)
		}
		if err := rows.Scan(dest...); err != nil {
			rows.Close()
			return out, fmt.Errorf("cannot read token_rollups baselines: %w", err)
		}
		key.Layer = engine.SeriesLayer(events.Layer(layer))
		at := time.Unix(int64(stepStart), 0).UTC()
		for i := range st {
			b.MergeSeries(key, at, rules.Metric(i), st[i].n, st[i].mean, st[i].vari, st[i].sample)
		}
		out.SeriesCells++
		if last.After(out.Through) {
			out.Through = last
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("cannot read token_rollups baselines: %w", err)
	}

	q = fmt.Sprintf(hostCells, steps, since.Unix(), until.Unix(), since.Unix(), until.Unix())
	rows, err = conn.Query(ctx, q)
	if err != nil {
		return out, fmt.Errorf("cannot query gpu_rollups for baselines: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var host string
		var stepStart uint32
		var last time.Time
		var eff, tpj stat
		if err := rows.Scan(&host, &stepStart, &last, &eff.n, &eff.mean, &eff.vari, &eff.sample, &tpj.n, &tpj.mean, &tpj.vari, &tpj.sample); err != nil {
			return out, fmt.Errorf("cannot read gpu_rollups baselines: %w", err)
		}
		at := time.Unix(int64(stepStart), 0).UTC()
		b.MergeHost(host, at, rules.GPUEfficiency, eff.n, eff.mean, eff.vari, eff.sample)
		b.MergeHost(host, at, rules.TokensPerJoule, tpj.n, tpj.mean, tpj.vari, tpj.sample)
		out.HostCells++
		if last.After(out.Through) {
			out.Through = last
		}
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("cannot read gpu_rollups baselines: %w", err)
	}
	return out, nil
}
