package report

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"strconv"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/schemas"
)

// BusinessSection is one question of the business view and the cookbook query that answers
// it.
type BusinessSection struct {
	Title string           `json:"title"`
	Query string           `json:"query"` // a file of schemas/clickhouse/queries
	Rows  []map[string]any `json:"rows"`
	ans   Answer
}

// businessSections lists the questions in the order they are printed; the verdict
// questions use thumbs, satisfied when up, and the percentiles the quality scores.
var businessSections = []struct{ title, file string }{
	{"Satisfaction and quality per scene and model", "quality_by_scene_model.sql"},
	{"Quality score percentiles per model, scene and input bucket", "quality_by_bucket.sql"},
	{"Satisfaction (thumbs up) by TTFT band of the rated request", "satisfaction_by_ttft_band.sql"},
	{"Satisfaction (thumbs up) by the longest stall of the rated stream", "satisfaction_by_stall.sql"},
	{"Task completion and turns per conversation", "conversations.sql"},
	{"Cost per conversation and per satisfied conversation (mean thumbs >= 0.5)", "cost_per_satisfied_conversation.sql"},
	{"Retries: a turn asked again after a timeout or an error", "retries.sql"},
	{"Feedback received, and how much of it found its request", "feedback_coverage.sql"},
}

// Business is the business view of one range: each section's answer, from the requests
// table and the verdicts view (feedback and the requests' inline scores), verdicts tied to
// their requests by request_id.
type Business struct {
	Range    Range             `json:"range"`
	Layer    string            `json:"layer"`
	Sections []BusinessSection `json:"sections"`
}

// QueryBusiness runs the business view's queries over r: requests of one layer (the
// gateway's when layer is "") starting in r and the verdicts given on them up to 7 days after r.
func QueryBusiness(ctx context.Context, conn driver.Conn, r Range, layer string) (Business, error) {
	if layer == "" {
		layer = DefaultLayer
	}
	b := Business{Range: Range{From: r.From.UTC(), To: r.To.UTC()}, Layer: layer}
	params := map[string]string{
		"from": strconv.FormatInt(r.From.Unix(), 10), "to": strconv.FormatInt(r.To.Unix(), 10),
		"name": "thumbs", "satisfied_at": "1", "layer": layer,
	}
	for _, s := range businessSections {
		raw, err := fs.ReadFile(schemas.Queries, "clickhouse/queries/"+s.file)
		if err != nil {
			return b, fmt.Errorf("cannot read the query %s: %w", s.file, err)
		}
		p := params
		if s.file == "cost_per_satisfied_conversation.sql" {
			p = map[string]string{"from": params["from"], "to": params["to"], "name": "thumbs", "satisfied_at": "0.5", "layer": layer}
		}
		if s.file == "quality_by_bucket.sql" {
			p = map[string]string{"from": params["from"], "to": params["to"], "name": "quality", "layer": layer}
		}
		if s.file == "feedback_coverage.sql" {
			p = map[string]string{"from": params["from"], "to": strconv.FormatInt(r.To.Unix()+7*86400, 10)}
		}
		sql, err := chdb.Bind(string(raw), p)
		if err != nil {
			return b, fmt.Errorf("cannot bind the query %s: %w", s.file, err)
		}
		ans, err := Run(ctx, conn, sql)
		if err != nil {
			return b, fmt.Errorf("%s: %w", s.file, err)
		}
		b.Sections = append(b.Sections, BusinessSection{Title: s.title, Query: s.file, Rows: ans.JSON(), ans: ans})
	}
	return b, nil
}

// WriteBusiness writes each section as a titled table.
func WriteBusiness(w io.Writer, b Business) error {
	fmt.Fprintf(w, "business view of %s requests from %s to %s (verdicts given up to 7 days later)\n", b.Layer,
		b.Range.From.Format("2006-01-02 15:04:05"), b.Range.To.Format("2006-01-02 15:04:05 UTC"))
	for _, s := range b.Sections {
		if _, err := fmt.Fprintf(w, "\n%s (%s)\n", s.Title, s.Query); err != nil {
			return fmt.Errorf("cannot write the answer: %w", err)
		}
		if err := WriteAnswer(w, s.ans); err != nil {
			return err
		}
	}
	return nil
}
