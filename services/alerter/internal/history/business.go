package history

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/services/alerter/internal/engine"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// BusinessBaselines takes scenes' business cells loaded from ClickHouse; *engine.Engine is
// one.
type BusinessBaselines interface {
	MergeBusiness(key engine.SceneKey, t time.Time, m rules.Metric, n uint64, mean, variance float64, sample []float64)
}

// Per window × env × scene, the share of positive satisfaction verdicts (windows and their
// corrections summed, as the alerter saw them once stored) and the completion rate of the
// gateway's requests' outcomes and the completion verdicts (positive completed, the rest
// abandoned), counted together as the engine counts them; a window enters the baseline only
// with the scene's minimum count of verdicts or outcomes (%s, a multiIf over the scenes the
// rules name), as the engine learns. Then per baseline step: count, mean, population variance
// and a few values.
const (
	satisfactionCells = `
SELECT env, scene, %s AS step, max(window_start) AS last,
    count(), avg(v), varPop(v), groupArray(3)(v)
FROM (
    SELECT window_start, env, scene, sum(positive) / sum(count) AS v, sum(count) AS n
    FROM feedback_rollups
    WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d) AND name = '%s' AND scene != ''
    GROUP BY window_start, env, scene
    HAVING n > 0 AND n >= %s
)
GROUP BY env, scene, step`

	completionCells = `
SELECT env, scene, %s AS step, max(window_start) AS last,
    count(), avg(v), varPop(v), groupArray(3)(v)
FROM (
    SELECT window_start, env, scene, sum(done) / (sum(done) + sum(quit)) AS v, sum(done) + sum(quit) AS n
    FROM (
        SELECT window_start, env, scene, completed AS done, abandoned AS quit
        FROM token_rollups
        WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d) AND layer = 'gateway'
        UNION ALL
        SELECT window_start, env, scene, least(positive, count) AS done, toUInt64(count - least(positive, count)) AS quit
        FROM feedback_rollups
        WHERE window_start >= toDateTime(%d) AND window_start < toDateTime(%d) AND name = '%s' AND scene != ''
    )
    GROUP BY window_start, env, scene
    HAVING n > 0 AND n >= %s
)
GROUP BY env, scene, step`
)

// minCount returns SQL for the minimum count of metric m in the scene of the row, and the
// scene names it compares with (bound as parameters, never spliced into the query).
func minCount(rs *rules.Set, m rules.Metric) (string, []any) {
	scenes := make([]string, 0, len(rs.Scenes))
	for s := range rs.Scenes {
		scenes = append(scenes, s)
	}
	sort.Strings(scenes)
	def := strconv.FormatUint(rs.Default.Dynamic[m].MinRequests, 10)
	if len(scenes) == 0 {
		return def, nil
	}
	var b strings.Builder
	b.WriteString("multiIf(")
	args := make([]any, 0, len(scenes))
	for _, s := range scenes {
		fmt.Fprintf(&b, "scene = ?, %d, ", rs.Scenes[s].Dynamic[m].MinRequests)
		args = append(args, s)
	}
	b.WriteString(def + ")")
	return b.String(), args
}

// LoadBusinessBaselines reads the satisfaction and completion-rate cells of windows starting
// in [since, until) into b, and returns how many it read and the start of the latest window.
func LoadBusinessBaselines(ctx context.Context, conn driver.Conn, b BusinessBaselines, rs *rules.Set, since, until time.Time, step time.Duration, loc *time.Location) (int, time.Time, error) {
	steps := stepExpr(step, loc, until)
	cells, through := 0, time.Time{}
	for _, q := range []struct {
		m     rules.Metric
		table string
		sql   func(minSQL string) string
	}{
		{rules.Satisfaction, "feedback_rollups", func(min string) string {
			return fmt.Sprintf(satisfactionCells, steps, since.Unix(), until.Unix(), rules.SatisfactionFeedback, min)
		}},
		{rules.CompletionRate, "token_rollups and feedback_rollups", func(min string) string {
			return fmt.Sprintf(completionCells, steps, since.Unix(), until.Unix(), since.Unix(), until.Unix(), rules.CompletionFeedback, min)
		}},
	} {
		minSQL, args := minCount(rs, q.m)
		rows, err := conn.Query(ctx, q.sql(minSQL), args...)
		if err != nil {
			return cells, through, fmt.Errorf("cannot query %s for %s baselines: %w", q.table, q.m, err)
		}
		for rows.Next() {
			var key engine.SceneKey
			var stepStart uint32
			var last time.Time
			var st stat
			if err := rows.Scan(&key.Env, &key.Scene, &stepStart, &last, &st.n, &st.mean, &st.vari, &st.sample); err != nil {
				rows.Close()
				return cells, through, fmt.Errorf("cannot read %s baselines: %w", q.m, err)
			}
			b.MergeBusiness(key, time.Unix(int64(stepStart), 0).UTC(), q.m, st.n, st.mean, st.vari, st.sample)
			cells++
			if last.After(through) {
				through = last
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return cells, through, fmt.Errorf("cannot read %s baselines: %w", q.m, err)
		}
	}
	return cells, through, nil
}
