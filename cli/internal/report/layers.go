package report

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// Layers are the layers a layers report shows, in the order a request passes them.
var Layers = []string{"app", "gateway", "engine"}

// LayerCell is one layer's view of one model × scene × input bucket.
type LayerCell struct {
	Layer    string      `json:"layer"`
	Requests uint64      `json:"requests"`
	TTFT     Percentiles `json:"ttft_ms"` // P99 is not read
}

// LayerRow is one model × scene × input bucket at every layer, in the order of Layers; a
// layer that saw none of its requests has a cell of zero requests.
type LayerRow struct {
	Model    string      `json:"model"`
	Scene    string      `json:"scene"`
	Bucket   string      `json:"bucket"`
	BucketLo uint32      `json:"bucket_lo"`
	Layers   []LayerCell `json:"layers"`
}

// LayersReport sets the TTFT each layer measured side by side: the app's holds the network
// and the gateway, the gateway's the way to the engine, the engine's its queue and prefill.
// Each cell reads its own layer; nothing is summed across layers.
type LayersReport struct {
	Range  Range      `json:"range"`
	Filter Filter     `json:"filter"`
	Rows   []LayerRow `json:"rows"`
}

// layersSQL reads each layer's rows of each bucket apart, naming the layers it reads.
const layersSQL = `
SELECT model, scene, bucket, lo, layer, n_requests,
    ttft_n, toFloat64(ttft[1]) AS ttft_p50, toFloat64(ttft[2]) AS ttft_p95
FROM
(
    SELECT model, scene, bucket, layer, min(bucket_lo) AS lo, sum(requests) AS n_requests,
        sum(arraySum(ttft_weights)) AS ttft_n,
        quantilesTDigestWeightedArray(0.50, 0.95)(ttft_means, ttft_weights) AS ttft
    FROM token_rollups
    WHERE %s AND layer IN ('app', 'gateway', 'engine')
    GROUP BY model, scene, bucket, layer
)
ORDER BY model, scene, lo, layer`

// layersQuery returns the layers query bound, and unbound with its parameters.
func layersQuery(r Range, f Filter) (bound, unbound string, params map[string]string, err error) {
	cond, params := whereLabels(r, f)
	unbound = fmt.Sprintf(layersSQL, cond)
	bound, err = chdb.Bind(unbound, params)
	return bound, unbound, params, err
}

// QueryLayers reads TTFT p50/p95 per model × scene × bucket at each layer under f (whose
// Layer is ignored: every layer is read, each apart).
func QueryLayers(ctx context.Context, conn driver.Conn, r Range, f Filter) (LayersReport, error) {
	if !r.From.Before(r.To) {
		return LayersReport{}, fmt.Errorf("cannot report on an empty range: from %s is not before to %s", r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	}
	f.Layer = ""
	rep := LayersReport{Range: Range{From: r.From.UTC(), To: r.To.UTC()}, Filter: f, Rows: []LayerRow{}}
	q, _, _, err := layersQuery(r, f)
	if err != nil {
		return rep, err
	}
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return rep, fmt.Errorf("cannot query the layers table: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			model, scene, bucket, layer string
			lo                          uint32
			c                           LayerCell
		)
		if err := rows.Scan(&model, &scene, &bucket, &lo, &layer, &c.Requests, &c.TTFT.N, &c.TTFT.P50, &c.TTFT.P95); err != nil {
			return rep, fmt.Errorf("cannot read a layers row: %w", err)
		}
		if c.TTFT.N == 0 {
			c.TTFT.P50, c.TTFT.P95 = 0, 0
		}
		n := len(rep.Rows)
		if n == 0 || rep.Rows[n-1].Model != model || rep.Rows[n-1].Scene != scene || rep.Rows[n-1].Bucket != bucket {
			row := LayerRow{Model: model, Scene: scene, Bucket: bucket, BucketLo: lo, Layers: make([]LayerCell, len(Layers))}
			for i, l := range Layers {
				row.Layers[i].Layer = l
			}
			rep.Rows = append(rep.Rows, row)
			n++
		}
		for i, l := range Layers {
			if l == layer {
				c.Layer = l
				rep.Rows[n-1].Layers[i] = c
			}
		}
	}
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("cannot read the layers table: %w", err)
	}
	return rep, nil
}

// WriteLayers writes TTFT p50/p95 per bucket at each layer side by side.
func WriteLayers(w io.Writer, r LayersReport) error {
	head := Heading(Report{Range: r.Range, Filter: r.Filter})
	if len(r.Rows) == 0 {
		_, err := fmt.Fprintf(w, "%s\nno requests in this range\n", head)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s\n", head)
	var cols strings.Builder
	for _, l := range Layers {
		fmt.Fprintf(&cols, "%s n\tTTFT p50\tp95\t", l)
	}
	fmt.Fprintf(tw, "model\tscene\tbucket\t%s\n", cols.String())
	for _, x := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t", Text(x.Model), Text(x.Scene), Text(x.Bucket))
		for _, c := range x.Layers {
			fmt.Fprintf(tw, "%d\t%s\t%s\t", c.Requests, ms(c.TTFT.N, c.TTFT.P50), ms(c.TTFT.N, c.TTFT.P95))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write the layers table: %w", err)
	}
	_, err := fmt.Fprintln(w, "TTFT in ms as each layer measured it, each layer's requests apart (never summed): the app's holds the gateway's, the gateway's the engine's (queue included)")
	return err
}
