package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestRollupsMatchSchemas checks that what the Go encoder writes for a feedback rollup and
// for a token rollup with outcomes passes their schemas, and that the schemas reject what
// they must.
func TestRollupsMatchSchemas(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		schema string
		v      any
		bad    map[string]string
	}{
		{"feedback_rollup.schema.json", &events.FeedbackRollup{
			V: events.Version, WindowStart: at, WindowSeconds: 15, Kind: events.KindWindow,
			Env: "prod", Scene: "customer-service", Model: "", Name: "thumbs", Source: string(events.SourceUser),
			Count: 40, Positive: 31, Late: 2, Sum: 31, ValueMin: 0, ValueMax: 1, ValueP50: 1, ValueP90: 1,
			ValueMeans: []float64{0, 1}, ValueWeights: []uint64{9, 31},
		}, map[string]string{
			"unknown source":   `"source":"robot"`,
			"negative count":   `"count":-1`,
			"empty name":       `"name":""`,
			"unknown kind":     `"kind":"partial"`,
			"missing positive": `"positive":null`,
		}},
		{"token_rollup.schema.json", &events.TokenRollup{
			V: events.Version, WindowStart: at, WindowSeconds: 15, Kind: events.KindWindow,
			Env: "prod", Scene: "chat", Model: "m", Layer: events.LayerGateway, Bucket: "0-500",
			Requests: 10, OK: 10, Completed: 7, Abandoned: 2,
		}, map[string]string{
			"negative completed":   `"completed":-1`,
			"fractional abandoned": `"abandoned":0.5`,
		}},
	}
	for _, c := range cases {
		sch := compileSchema(t, c.schema)
		raw, err := json.Marshal(c.v)
		if err != nil {
			t.Fatal(err)
		}
		if err := validateSchema(sch, raw); err != nil {
			t.Fatalf("%s: %s: %v", c.schema, raw, err)
		}
		for name, bad := range c.bad {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			var kv map[string]json.RawMessage
			if err := json.Unmarshal([]byte("{"+bad+"}"), &kv); err != nil {
				t.Fatal(err)
			}
			for k, v := range kv {
				if string(v) == "null" {
					delete(m, k)
				} else {
					m[k] = v
				}
			}
			b, _ := json.Marshal(m)
			if validateSchema(sch, b) == nil {
				t.Fatalf("%s: %s: the schema accepts %s", c.schema, name, b)
			}
		}
	}
	var back events.FeedbackRollup
	raw, _ := json.Marshal(cases[0].v)
	if err := json.Unmarshal(raw, &back); err != nil || back.Positive != 31 || back.Scene != "customer-service" {
		t.Fatalf("round trip: %v %+v", err, back)
	}
}
