package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestWatermarkMatchesSchema: the watermark the aggregator publishes passes its schema, on
// the subject its consumer names.
func TestWatermarkMatchesSchema(t *testing.T) {
	sch := compileSchema(t, "rollup_watermark.schema.json")
	through := time.Date(2026, 3, 3, 12, 0, 15, 0, time.UTC)
	data, err := json.Marshal(events.Watermark{V: 1, Consumer: "agg-0", Through: through, WindowSeconds: 15, At: through.Add(31 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if err := validateSchema(sch, data); err != nil {
		t.Fatal(err)
	}
	if err := validateSchema(sch, []byte(`{"v":1,"consumer":"agg-0","window_seconds":15}`)); err == nil {
		t.Error("a watermark without through passed the schema")
	}
	if got := events.WatermarkSubject("agg.0"); got != "rollup.watermark.agg_0" {
		t.Errorf("subject %s", got)
	}
}
