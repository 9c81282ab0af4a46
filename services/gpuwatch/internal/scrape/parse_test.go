package scrape

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
)

func TestWanted(t *testing.T) {
	types := map[string]dto.MetricType{
		"vllm:time_to_first_token_seconds": dto.MetricType_HISTOGRAM,
		"vllm:num_requests_running":        dto.MetricType_GAUGE,
	}
	f := func(series string, want bool) {
		t.Helper()
		if _, got := slotOf([]byte(series), names["vllm"], types); got != want {
			t.Errorf("slotOf(%q) wanted = %v, want %v", series, got, want)
		}
	}
	f(`vllm:num_requests_running{engine="0",model_name="m"}`, true)
	f(`vllm:num_requests_running`, true)
	f(`vllm:prompt_tokens_total{model_name="m"}`, true)
	f(`vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"}`, true)
	f(`vllm:time_to_first_token_seconds_count{model_name="m"}`, true)
	f(`vllm:time_to_first_token_seconds_sum`, true)
	f(`vllm:prompt_tokens_created{model_name="m"}`, true)                      // creation times tell a reset
	f(`vllm:e2e_request_latency_seconds_bucket{le="1",model_name="m"}`, false) // not read
	f(`vllm:num_requests_running_count{model_name="m"}`, false)                // a gauge has no parts
	f(`python_gc_objects_collected_total{generation="0"}`, false)
	// a quoted name is inside the braces: only the labels tell
	f(`{"vllm:num_requests_running",model_name="m"}`, true)
	f(`{"python_gc_objects_collected_total"}`, true)
}

// A series whose name is quoted (the UTF-8 form) is read as the same series unquoted.
func TestFamiliesQuotedName(t *testing.T) {
	body := "# TYPE vllm:num_requests_running gauge\n" +
		"{\"vllm:num_requests_running\",engine=\"0\",model_name=\"m\"} 3\n" +
		"vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4\n" +
		"# TYPE vllm:e2e_request_latency_seconds histogram\n" +
		"vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 9\n"
	fams, err := families([]byte(body), names["vllm"], newSeriesCache(0))
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) != 1 {
		t.Fatalf("%d families, want 1: %v", len(fams), fams)
	}
	if got := len(fams["vllm:num_requests_running"].GetMetric()); got != 2 {
		t.Fatalf("%d series of vllm:num_requests_running, want 2", got)
	}
}

// The series cache holds the series of the last scrape only, and what it says is what the
// labels say: the same families come back from a warm cache as from a cold one.
func TestSeriesCache(t *testing.T) {
	c := newSeriesCache(0)
	read := func(body string) map[string]*dto.MetricFamily {
		t.Helper()
		fams, err := families([]byte(body), names["vllm"], c)
		if err != nil {
			t.Fatal(err)
		}
		return fams
	}
	a := "# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\",model_name=\"a\"} 1\n" +
		"vllm:num_requests_running{engine=\"1\",model_name=\"a\"} 2\n" +
		"# TYPE vllm:e2e_request_latency_seconds gauge\n" +
		"vllm:e2e_request_latency_seconds{model_name=\"a\"} 9\n"
	read(a)
	if len(c.entries) != 2 {
		t.Fatalf("%d series cached, want the 2 read", len(c.entries))
	}
	b := "# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\",model_name=\"b\"} 3\n"
	fams := read(b)
	if len(c.entries) != 1 {
		t.Fatalf("%d series cached after a scrape of 1, want 1", len(c.entries))
	}
	if got := canonical(fams["vllm:num_requests_running"]); got != canonical(mustFamilies(t, b)["vllm:num_requests_running"]) {
		t.Fatalf("cached read differs: %s", got)
	}
	// textparse writes le by the type of the TYPE line above the series: read under
	// another type, the same series is read anew.
	h := "# TYPE vllm:request_queue_time_seconds histogram\n" +
		"vllm:num_requests_running{le=\"1\",model_name=\"a\"} 1\n"
	read(h)
	g := "# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{le=\"1\",model_name=\"a\"} 1\n"
	got, want := canonical(read(g)["vllm:num_requests_running"]), canonical(mustFamilies(t, g)["vllm:num_requests_running"])
	if got != want || got == "" {
		t.Fatalf("after a type change:\n%s\nwant\n%s", got, want)
	}
}

func mustFamilies(t *testing.T, body string) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := families([]byte(body), names["vllm"], newSeriesCache(0))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}
