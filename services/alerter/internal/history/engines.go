package history

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
)

// EngineBaselines takes engine cells loaded from ClickHouse; *engine.Engine is one.
type EngineBaselines interface {
	MergeEngine(key engine.EngineKey, t time.Time, v engine.EngineValue, n uint64, mean, variance float64, sample []float64)
}

// The rows of engine_rollups, sorted so that each engine's windows arrive in order and a
// window's rows (the window's, its corrections) together: the histograms are merged bucket
// by bucket here, so that a window's p95 is read off its summed counts as the alerter does.
const engineRows = `
SELECT window_start, host, name, model, up_samples, queue_depth_avg,
    queue_time_le, queue_time_counts, queue_time_count, prefill_le, prefill_counts, prefill_count
FROM engine_rollups
WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d)
ORDER BY host, name, model, window_start`

// engineWindow gathers one engine window's rows.
type engineWindow struct {
	key            engine.EngineKey
	start          time.Time
	up             uint64
	depthW         float64
	queue, prefill histSum
}

type histSum struct {
	le, counts []float64
	count      float64
	mismatch   bool
}

func (h *histSum) add(le, counts []float64, count float64) {
	switch {
	case count <= 0 || len(counts) != len(le)+1:
		return
	case h.count == 0:
		h.le, h.counts = append(h.le[:0], le...), append(h.counts[:0], counts...)
	case !slices.Equal(h.le, le):
		h.mismatch = true // bounds changed within a window: keep the first row's
		return
	default:
		for i, c := range counts {
			h.counts[i] += c
		}
	}
	h.count += count
}

// p95 returns the merged p95 in ms.
func (h *histSum) p95() (float64, bool) {
	if h.count <= 0 {
		return 0, false
	}
	v := events.HistogramQuantile(0.95, h.le, h.counts)
	return v * 1000, !math.IsNaN(v)
}

// cellAcc is the running count, mean, M2 and first values of one value in one step.
type cellAcc struct {
	n        uint64
	mean, m2 float64
	sample   []float64
}

func (c *cellAcc) add(v float64) {
	c.n++
	d := v - c.mean
	c.mean += d / float64(c.n)
	c.m2 += d * (v - c.mean)
	if len(c.sample) < 3 {
		c.sample = append(c.sample, v)
	}
}

// LoadEngineBaselines reads the engine cells of windows starting in [since, until) into b
// and returns how many cells it merged and the start of the latest window read.
func LoadEngineBaselines(ctx context.Context, conn driver.Conn, b EngineBaselines, since, until time.Time, step time.Duration, loc *time.Location) (int, time.Time, error) {
	var through time.Time
	cellsN := 0
	sec, shift := stepShift(step, loc, until) // steps of the time of day in loc (stepExpr)
	rows, err := conn.Query(ctx, fmt.Sprintf(engineRows, since.Unix(), until.Unix()))
	if err != nil {
		return 0, through, fmt.Errorf("cannot query engine_rollups for baselines: %w", err)
	}
	defer rows.Close()

	var (
		cur      *engineWindow
		cellKey  engine.EngineKey
		cellStep int64 = math.MinInt64
		acc      [3]cellAcc
	)
	flushCell := func() {
		if cellStep == math.MinInt64 {
			return
		}
		at := time.Unix(cellStep*sec-shift, 0).UTC()
		for i, v := range []engine.EngineValue{engine.EngineQueueDepth, engine.EngineQueueTimeP95, engine.EnginePrefillP95} {
			if c := &acc[i]; c.n > 0 {
				b.MergeEngine(cellKey, at, v, c.n, c.mean, c.m2/float64(c.n), c.sample)
			}
			acc[i] = cellAcc{}
		}
		cellsN++
	}
	flushWindow := func() {
		if cur == nil || cur.up == 0 {
			return
		}
		st := (cur.start.Unix() + shift) / sec
		if cur.key != cellKey || st != cellStep {
			flushCell()
			cellKey, cellStep = cur.key, st
		}
		acc[0].add(cur.depthW / float64(cur.up))
		if v, ok := cur.queue.p95(); ok {
			acc[1].add(v)
		}
		if v, ok := cur.prefill.p95(); ok {
			acc[2].add(v)
		}
		if cur.start.After(through) {
			through = cur.start
		}
	}
	for rows.Next() {
		var (
			start                      time.Time
			key                        engine.EngineKey
			up                         uint64
			depth, qCount, pCount      float64
			qLe, qCounts, pLe, pCounts []float64
		)
		if err := rows.Scan(&start, &key.Host, &key.Name, &key.Model, &up, &depth, &qLe, &qCounts, &qCount, &pLe, &pCounts, &pCount); err != nil {
			return cellsN, through, fmt.Errorf("cannot read engine_rollups baselines: %w", err)
		}
		if cur == nil || cur.key != key || !cur.start.Equal(start) {
			flushWindow()
			cur = &engineWindow{key: key, start: start}
		}
		cur.up += up
		cur.depthW += depth * float64(up)
		cur.queue.add(qLe, qCounts, qCount)
		cur.prefill.add(pLe, pCounts, pCount)
	}
	if err := rows.Err(); err != nil {
		return cellsN, through, fmt.Errorf("cannot read engine_rollups baselines: %w", err)
	}
	flushWindow()
	flushCell()
	return cellsN, through, nil
}
