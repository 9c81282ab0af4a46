package srcconfig

import (
	"strings"
	"testing"
)

func TestProgramEnvVars(t *testing.T) {
	p, err := NewReader(root).Program("deploy/internal/srcconfig/testdata/prog")
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.EnvVars()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"PROG_ADDR": "127.0.0.1:1", "LIB_LEVEL": "3", "PROG_DIRECT": "", "PROG_LOOKUP": "",
		"PROG_FROM_MAP": "", "PROG_RANGED_A": "", "PROG_RANGED_B": ""}
	for k, v := range want {
		if d, ok := got[k]; !ok || d != v {
			t.Errorf("%s: default %q (read: %v), want %q", k, d, ok, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("read %v, want only %v", got, want)
	}
}

func TestProgramMetrics(t *testing.T) {
	p, err := NewReader(root).Program("deploy/internal/srcconfig/testdata/prog")
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"prog_lib_up":       "lib/lib.go:14", // namespace from the call, subsystem from another file
		"prog_first_total":  "prog/main.go:36",
		"prog_second_total": "prog/main.go:36",
		"prog_sub_desc":     "prog/main.go:40", // BuildFQName
		"raw:name":          "prog/main.go:41",
		"prog_things_total": "lib/lib.go:18", // a field set on the variable passed
		"a_x":               "prog/main.go:57",
		"b_y":               "prog/main.go:57",
	}
	for k, at := range want {
		if got[k] == "" || !strings.HasSuffix(got[k], at) {
			t.Errorf("%s: defined at %q, want %s", k, got[k], at)
		}
	}
	if len(got) != len(want) {
		t.Errorf("defined %v, want only %v (no a_y, never_total, test_only_total, comment_total)", got, want)
	}
}

// TestProgramUnknownNames: a name made at run time, or one given through a function passed
// as a value, is an error naming where it is, never a name silently left out.
func TestProgramUnknownNames(t *testing.T) {
	p, err := NewReader(root).Program("deploy/internal/srcconfig/testdata/dynamic")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.EnvVars(); err == nil || !strings.Contains(err.Error(), "dynamic/main.go:13") {
		t.Errorf("EnvVars: %v, want an error at main.go:13", err)
	}
	_, err = p.Metrics()
	for _, at := range []string{"dynamic/main.go:14", "dynamic/main.go:20"} {
		if err == nil || !strings.Contains(err.Error(), at) {
			t.Errorf("Metrics: %v, want an error at %s", err, at)
		}
	}
}

// TestProgramServices: the services' binaries, as the README test reads them.
func TestProgramServices(t *testing.T) {
	r := NewReader(root)
	tests := []struct {
		dir         string
		vars        []string
		metrics     []string
		notVars     []string
		notMetrics  []string
		minPackages int
	}{
		{dir: "services/aggregator", vars: []string{"AGG_WINDOW", "AGG_ACK_WAIT", "NATS_TLS_CA", "CLICKHOUSE_HTTP_ADDR"},
			metrics:    []string{"aggregator_events_total", "aggregator_published_total", "aggregator_connections_open"},
			notMetrics: []string{"emitter_published_total", "gpuwatch_published_total", "alerter_connections_open"}, minPackages: 5},
		{dir: "services/emitter", vars: []string{"LOG_LEVEL", "OPENAI_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT"},
			metrics: []string{"emitter_proxy_requests_total", "emitter_ingest_requests_total", "emitter_feedback_requests_total",
				"emitter_publish_buffered_bytes", "vllm:num_requests_running"},
			notVars: []string{"CLICKHOUSE_ADDR", "CI"}, minPackages: 5},
		{dir: "services/alerter", metrics: []string{"alerter_alerts_firing", "alerter_connections_open"},
			notMetrics: []string{"alerter_published_total"}, minPackages: 5}, // no publisher of pkg/bus
		{dir: "services/gpuwatch", vars: []string{"GPUWATCH_SYNTHETIC_SEED"}, metrics: []string{"DCGM_FI_DEV_GPU_UTIL", "gpuwatch_nvml_reading_supported"},
			minPackages: 5},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			p, err := r.Program(tt.dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.pkgs) < tt.minPackages {
				t.Errorf("%d packages, want at least %d", len(p.pkgs), tt.minPackages)
			}
			vars, err := p.EnvVars()
			if err != nil {
				t.Fatal(err)
			}
			metrics, err := p.Metrics()
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range tt.vars {
				if _, ok := vars[v]; !ok {
					t.Errorf("%s not read", v)
				}
			}
			for _, v := range tt.notVars {
				if _, ok := vars[v]; ok {
					t.Errorf("%s read", v)
				}
			}
			for _, m := range tt.metrics {
				if _, ok := metrics[m]; !ok {
					t.Errorf("%s not defined", m)
				}
			}
			for _, m := range tt.notMetrics {
				if _, ok := metrics[m]; ok {
					t.Errorf("%s defined", m)
				}
			}
		})
	}
}
