package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

const engineColumns = `window_start, window_seconds, kind, host, engine, name, model,
samples, up_samples, down_samples, queue_depth_avg, queue_depth_max, running_avg, running_max,
kv_cache_usage_avg, kv_cache_usage_max, cache_hit_rate_avg,
prefix_cache_queries, prefix_cache_hits, preemptions, prompt_tokens, generation_tokens,
prompt_tokens_per_s, generation_tokens_per_s,
queue_time_le, queue_time_counts, queue_time_sum, queue_time_count, queue_time_p50, queue_time_p95, queue_time_p99,
ttft_le, ttft_counts, ttft_sum, ttft_count, ttft_p50, ttft_p95, ttft_p99,
prefill_le, prefill_counts, prefill_sum, prefill_count, prefill_p50, prefill_p95, prefill_p99,
decode_le, decode_counts, decode_sum, decode_count, decode_p50, decode_p95, decode_p99,
consumer, seq_through, flush_id, written_at`

// WriteEngineRollups inserts rows into engine_rollups in one batch.
func (c *ClickHouse) WriteEngineRollups(ctx context.Context, rows []events.EngineRollup, l Ledger, now time.Time) error {
	if len(rows) == 0 {
		return nil
	}
	ictx, err := c.insertCtx(ctx)
	if err != nil {
		return err
	}
	b, err := c.conn.PrepareBatch(ictx, "INSERT INTO engine_rollups ("+engineColumns+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into engine_rollups: %w", err)
	}
	for i := range rows {
		r := &rows[i]
		args := []any{r.WindowStart, uint32(r.WindowSeconds), r.Kind, r.Host, r.Engine, r.Name, r.Model,
			r.Samples, r.UpSamples, r.DownSamples, r.QueueDepthAvg, r.QueueDepthMax, r.RunningAvg, r.RunningMax,
			r.KVCacheUsageAvg, r.KVCacheUsageMax, r.CacheHitRateAvg,
			r.PrefixCacheQueries, r.PrefixCacheHits, r.Preemptions, r.PromptTokens, r.GenerationTokens,
			r.PromptTokensPerS, r.GenerationTokensPerS}
		for _, h := range []*events.EngineHistogram{&r.QueueTime, &r.TTFT, &r.PrefillTime, &r.DecodeTime} {
			le, counts := h.Le, h.Counts
			if le == nil {
				le = []float64{}
			}
			if counts == nil {
				counts = []float64{}
			}
			args = append(args, le, counts, h.Sum, h.Count, h.P50, h.P95, h.P99)
		}
		args = append(args, c.consumer, l.SeqThrough, l.FlushID, now)
		if err := b.Append(args...); err != nil {
			_ = b.Abort()
			return fmt.Errorf("cannot add a row to the engine_rollups batch: %w", err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into engine_rollups: %w", len(rows), err)
	}
	return nil
}
