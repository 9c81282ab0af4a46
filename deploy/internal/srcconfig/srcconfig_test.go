package srcconfig

import (
	"slices"
	"testing"
)

const root = "../../.."

func TestEnvVars(t *testing.T) {
	r := NewReader(root)
	tests := []struct {
		name    string
		dir     string
		typ     string
		want    map[string]string // variable -> default
		notWant []string
		wantErr bool
	}{
		{name: "fixture", dir: "deploy/internal/srcconfig/testdata/cfg", typ: "Config",
			want: map[string]string{"ADDR": "127.0.0.1:1", "SECRET": "", "WAIT": "5s", "DB_ADDR": "127.0.0.1:9000",
				"DB_DIAL_TIMEOUT": "5s", "IN_LEVEL": "3", "LEVEL": "3"},
			notWant: []string{"Skipped", "SKIPPED", "-", "ADDR,required", "SECRET,required"}},
		{name: "aggregator", dir: "services/aggregator", typ: "Config",
			want: map[string]string{"HTTP_ADDR": "127.0.0.1:9103", "AGG_WINDOW": "15s", "AGG_LOG_LEVEL": "info",
				"NATS_URL": "nats://127.0.0.1:4222", "NATS_STREAM_REPLICAS": "1", "CLICKHOUSE_DB": "tokenscope"},
			notWant: []string{"WINDOW", "URL", "STREAM_REPLICAS", "LOG_LEVEL"}},
		{name: "gpuwatch", dir: "services/gpuwatch", typ: "Config",
			want:    map[string]string{"GPUWATCH_SYNTHETIC_GPUS": "2", "GPUWATCH_HOST": "", "HTTP_ADDR": "127.0.0.1:9102"},
			notWant: []string{"CLICKHOUSE_ADDR", "GPUS"}},
		{name: "emitter", dir: "services/emitter", typ: "Config",
			want:    map[string]string{"LOG_LEVEL": "info", "EMITTER_UPSTREAM_URL": "http://127.0.0.1:8081", "NATS_TLS_CA": ""},
			notWant: []string{"CLICKHOUSE_ADDR"}},
		{name: "missing type", dir: "services/emitter", typ: "Nope", wantErr: true},
		{name: "not a struct", dir: "deploy/internal/srcconfig", typ: "ModulePrefix", wantErr: true},
		{name: "missing dir", dir: "services/nope", typ: "Config", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.EnvVars(tt.dir, tt.typ)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			for k, v := range tt.want {
				if d, ok := got[k]; !ok || d != v {
					t.Errorf("%s: default %q (present %v), want %q", k, d, ok, v)
				}
			}
			for _, k := range tt.notWant {
				if _, ok := got[k]; ok {
					t.Errorf("%s should not be a variable", k)
				}
			}
		})
	}
}

func TestFlags(t *testing.T) {
	r := NewReader(root)
	f := func(dir, fn string, want, notWant []string, wantErr bool) {
		t.Helper()
		got, err := r.Flags(dir, fn)
		if (err != nil) != wantErr {
			t.Fatalf("%s.%s: err = %v, wantErr %v", dir, fn, err, wantErr)
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("%s.%s: no flag %q in %v", dir, fn, w, got)
			}
		}
		for _, w := range notWant {
			if slices.Contains(got, w) {
				t.Errorf("%s.%s: flag %q should not be there", dir, fn, w)
			}
		}
	}
	f("deploy/internal/srcconfig/testdata/cfg", "cmd", []string{"name", "wait", "verbose"}, []string{"cmd", "other"}, false)
	f("services/emitter", "runReplay", []string{"simulate", "loop", "incident", "model-ttft", "url", "publish"}, []string{"replay"}, false)
	f("services/emitter", "runFakeLLM", []string{"addr", "ttft", "error-rate", "stall-rate"}, nil, false)
	f("services/emitter", "noSuchFunc", nil, nil, true)
	f("services/emitter", "newLogger", nil, nil, true) // makes no FlagSet
}
