package events_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/schemas"
)

// crossField lists the fixtures whose rule a JSON Schema cannot express; for them only
// Validate rejects, and the schema's "valid" verdict is expected.
var crossField = map[string]string{
	"request/invalid/ttft_above_total.json":                "ttft_ms <= total_ms compares two fields",
	"request/invalid/out_of_range_cached_above_input.json": "cached_input_tokens <= input_tokens compares two fields",
	"request/invalid/future_timestamp.json":                "how far ahead ts may be depends on the clock",
	"request/invalid/not_utf8.json":                        "JSON decoders replace invalid UTF-8 before the schema sees it",
	"gpu/invalid/out_of_range_mem_used_above_total.json":   "mem_used_bytes <= mem_total_bytes compares two fields",
	"engine/invalid/out_of_range_le_not_increasing.json":   "le increasing compares items",
	"engine/invalid/out_of_range_count_not_sum.json":       "count = the sum of counts compares fields",
	"engine/invalid/out_of_range_counts.json":              "len(counts) = len(le) + 1 compares two fields",
	"engine/invalid/out_of_range_hits_above_queries.json":  "prefix_cache_hits <= prefix_cache_queries compares two fields",
	"feedback/invalid/future_timestamp.json":               "how far ahead ts may be depends on the clock",
	"host/invalid/out_of_range_used_above_total.json":      "mem_used_bytes <= mem_total_bytes compares two fields",
	"host/invalid/out_of_range_available_above_total.json": "mem_available_bytes <= mem_total_bytes compares two fields",
	"gpu/invalid/malformed_duplicate_key.json":             "JSON parsers keep one of a key's duplicates before the schema sees the object",
	"request/invalid/malformed_duplicate_key.json":         "JSON parsers keep one of a key's duplicates before the schema sees the object",
	"feedback/invalid/malformed_duplicate_key.json":        "JSON parsers keep one of a key's duplicates before the schema sees the object",
	"host/invalid/malformed_cased_key.json":                "mem_used_bytes is optional: to the schema Mem_Used_Bytes is another property",
	"request/invalid/malformed_cased_key.json":             "tenant is optional: to the schema Tenant is another property",
	"feedback/invalid/malformed_cased_key.json":            "model is optional: to the schema Model is another property",
}

func compileSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	raw, err := fs.ReadFile(schemas.JSON, name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s is not JSON: %v", name, err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	url := "https://tokenscope.dev/schemas/" + name
	if err := c.AddResource(url, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		t.Fatalf("cannot compile %s: %v", name, err)
	}
	return sch
}

// TestSchemaConformance gives every fixture to both the JSON Schema and the Go decoder and
// validator: they must agree, except for the listed cross-field rules. An invalid fixture's
// file name starts with the reason Validate must give.
func TestSchemaConformance(t *testing.T) {
	kinds := []struct {
		dir, schema string
		check       func([]byte) error
	}{
		{"request", "request_event.schema.json", func(b []byte) error {
			var ev events.RequestEvent
			if err := events.UnmarshalRequest(b, &ev); err != nil {
				return err
			}
			return ev.ValidateAt(testNow)
		}},
		{"gpu", "gpu_sample.schema.json", func(b []byte) error {
			var s events.GPUSample
			if err := events.UnmarshalGPUSample(b, &s); err != nil {
				return err
			}
			return s.ValidateAt(testNow)
		}},
		{"feedback", "feedback_event.schema.json", func(b []byte) error {
			var ev events.FeedbackEvent
			if err := events.UnmarshalFeedback(b, &ev); err != nil {
				return err
			}
			return ev.ValidateAt(testNow)
		}},
		{"engine", "engine_sample.schema.json", func(b []byte) error {
			var s events.EngineSample
			if err := events.UnmarshalEngineSample(b, &s); err != nil {
				return err
			}
			return s.ValidateAt(testNow)
		}},
		{"host", "host_sample.schema.json", func(b []byte) error {
			var s events.HostSample
			if err := events.UnmarshalHostSample(b, &s); err != nil {
				return err
			}
			return s.ValidateAt(testNow)
		}},
	}
	reasons := events.Reasons()
	slices.SortFunc(reasons, func(a, b string) int { return len(b) - len(a) }) // longest prefix first
	for _, k := range kinds {
		sch := compileSchema(t, k.schema)
		for _, verdict := range []string{"valid", "invalid"} {
			files, _ := filepath.Glob(filepath.Join("testdata", k.dir, verdict, "*.json"))
			if len(files) == 0 {
				t.Fatalf("no fixtures in testdata/%s/%s", k.dir, verdict)
			}
			for _, file := range files {
				rel := k.dir + "/" + verdict + "/" + filepath.Base(file)
				t.Run(rel, func(t *testing.T) {
					raw, err := os.ReadFile(file)
					if err != nil {
						t.Fatal(err)
					}
					goErr := k.check(raw)
					schemaErr := validateSchema(sch, raw)
					wantValid := verdict == "valid"
					if (goErr == nil) != wantValid {
						t.Fatalf("Go verdict: %v, want valid=%v", goErr, wantValid)
					}
					if goErr != nil && !errors.Is(goErr, events.ErrInvalidEvent) {
						t.Fatalf("error %v does not wrap ErrInvalidEvent", goErr)
					}
					if !wantValid {
						want := ""
						for _, r := range reasons {
							if strings.HasPrefix(filepath.Base(file), r) {
								want = r
								break
							}
						}
						if got := events.Reason(goErr); got != want {
							t.Fatalf("reason %q (%v), want %q from the file name", got, goErr, want)
						}
					}
					if why, ok := crossField[rel]; ok {
						if schemaErr != nil {
							t.Fatalf("listed as beyond the schema (%s) but the schema rejects it: %v", why, schemaErr)
						}
						return
					}
					if (schemaErr == nil) != wantValid {
						t.Fatalf("schema verdict: %v, want valid=%v", schemaErr, wantValid)
					}
				})
			}
		}
	}
}

func validateSchema(sch *jsonschema.Schema, raw []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

// TestEncodedHostSampleMatchesSchema checks that what MarshalHostSample writes, every
// reading present, passes the schema and decodes back to the same sample.
func TestEncodedHostSampleMatchesSchema(t *testing.T) {
	sch := compileSchema(t, "host_sample.schema.json")
	u := func(v uint64) *uint64 { return &v }
	f := func(v float64) *float64 { return &v }
	in := events.HostSample{V: events.Version, TS: testNow.Add(-time.Second), Host: "gpu-node-3",
		MemTotalBytes: u(100), MemUsedBytes: u(40), MemAvailableBytes: u(60),
		DeltaSeconds: f(1), DiskReadBps: f(512), DiskWriteBps: f(0), NetRxBps: f(1e9), NetTxBps: f(2.5)}
	data, err := events.MarshalHostSample(&in)
	if err != nil {
		t.Fatal(err)
	}
	if err := validateSchema(sch, data); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	var out events.HostSample
	if err := events.UnmarshalHostSample(data, &out); err != nil {
		t.Fatal(err)
	}
	if err := out.ValidateAt(testNow); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

// TestEncodedEventsMatchSchema checks that what the Go encoder writes passes the schema.
func TestEncodedEventsMatchSchema(t *testing.T) {
	sch := compileSchema(t, "request_event.schema.json")
	ev := sampleEvent()
	ev.Outcome = events.OutcomeCompleted
	if err := validateSchema(sch, events.AppendRequest(nil, &ev)); err != nil {
		t.Fatal(err)
	}
}

// TestOtherSchemasCompile keeps the rollup and alert schemas loadable.
func TestOtherSchemasCompile(t *testing.T) {
	for _, name := range []string{"token_rollup.schema.json", "gpu_rollup.schema.json", "engine_rollup.schema.json", "host_rollup.schema.json", "feedback_rollup.schema.json", "alert.schema.json", "rollup_watermark.schema.json"} {
		compileSchema(t, name)
	}
}
