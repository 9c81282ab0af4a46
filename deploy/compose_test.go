package deploy

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/tokenscope/tokenscope/deploy/internal/srcconfig"
)

// repoRoot is the repository root, relative to this package.
const repoRoot = ".."

// loadCompose loads compose.yaml as docker compose would, with every profile enabled and
// environ as the shell's environment.
func loadCompose(t *testing.T, environ map[string]string) *types.Project {
	t.Helper()
	return loadComposeFiles(t, environ, "compose.yaml")
}

// loadComposeFiles loads the compose files of this directory, each merged over the ones
// before it, as docker compose -f a -f b would, with every profile enabled and environ as
// the shell's environment.
func loadComposeFiles(t *testing.T, environ map[string]string, files ...string) *types.Project {
	t.Helper()
	details := types.ConfigDetails{Environment: environ}
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		details.WorkingDir = filepath.Dir(abs)
		details.ConfigFiles = append(details.ConfigFiles, types.ConfigFile{Filename: abs})
	}
	p, err := loader.LoadWithContext(context.Background(), details, loader.WithProfiles([]string{"*"}))
	if err != nil {
		t.Fatalf("docker compose would not load %s: %v", strings.Join(files, " + "), err)
	}
	return p
}

// tokenscopeService returns the tokenscope service a compose service runs (from its
// image, tokenscope/<name>), or "".
func tokenscopeService(s types.ServiceConfig) string {
	repo, _, _ := strings.Cut(s.Image, ":")
	name, ok := strings.CutPrefix(repo, "tokenscope/")
	if !ok {
		return ""
	}
	return name
}

func TestComposeServices(t *testing.T) {
	p := loadCompose(t, nil)
	type want struct {
		profiles  []string
		dependsOn []string // all with condition service_healthy
		health    bool
	}
	wants := map[string]want{
		"nats":          {health: true},
		"clickhouse":    {health: true},
		"emitter":       {dependsOn: []string{"nats"}, health: true},
		"aggregator":    {dependsOn: []string{"clickhouse", "nats"}, health: true},
		"alerter":       {dependsOn: []string{"aggregator", "clickhouse", "nats"}, health: true},
		"gpuwatch":      {profiles: []string{"gpu"}, dependsOn: []string{"nats"}, health: true},
		"fakellm":       {profiles: []string{"demo"}, health: true},
		"load":          {profiles: []string{"demo"}, dependsOn: []string{"emitter", "fakellm"}},
		"load-sim":      {profiles: []string{"demo"}, dependsOn: []string{"nats"}},
		"gpuwatch-demo": {profiles: []string{"demo"}, dependsOn: []string{"nats"}, health: true},
		"gpuwatch-sim":  {profiles: []string{"demo"}, dependsOn: []string{"nats"}, health: true},
		"grafana":       {dependsOn: []string{"aggregator", "clickhouse"}, health: true},
	}
	names := p.ServiceNames()
	slices.Sort(names)
	var wantNames []string
	for n := range wants {
		wantNames = append(wantNames, n)
	}
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Fatalf("services %v, want %v", names, wantNames)
	}
	for name, w := range wants {
		s := p.Services[name]
		if !slices.Equal(s.Profiles, w.profiles) {
			t.Errorf("%s: profiles %v, want %v", name, s.Profiles, w.profiles)
		}
		var deps []string
		for dep, d := range s.DependsOn {
			deps = append(deps, dep)
			if d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s depends on %s with condition %q, want service_healthy", name, dep, d.Condition)
			}
			if p.Services[dep].HealthCheck == nil {
				t.Errorf("%s waits for %s to be healthy, which has no health check", name, dep)
			}
		}
		slices.Sort(deps)
		if !slices.Equal(deps, w.dependsOn) {
			t.Errorf("%s: depends on %v, want %v", name, deps, w.dependsOn)
		}
		hc := s.HealthCheck
		if w.health != (hc != nil && !hc.Disable) {
			t.Fatalf("%s: health check %+v, want one: %v", name, hc, w.health)
		}
		if hc != nil {
			if len(hc.Test) < 2 || (hc.Test[0] != "CMD" && hc.Test[0] != "CMD-SHELL") || hc.Interval == nil || hc.Retries == nil || hc.StartPeriod == nil {
				t.Errorf("%s: health check %v lacks a command, interval, retries or start period", name, hc.Test)
			}
		}
		if s.Restart != "unless-stopped" {
			t.Errorf("%s: restart %q, want unless-stopped", name, s.Restart)
		}
	}

	// NATS: JetStream on, stored on a volume, health from the monitoring port.
	nats := p.Services["nats"]
	cmd := strings.Join(nats.Command, " ")
	if !strings.Contains(cmd, "-js") || !strings.Contains(cmd, "-sd /data") || !strings.Contains(cmd, "-m 8222") {
		t.Errorf("nats command %q: want -js, -sd /data and -m 8222", cmd)
	}
	if !strings.Contains(strings.Join(nats.HealthCheck.Test, " "), "8222/healthz?js-enabled-only=true") {
		t.Errorf("nats health check %v does not ask /healthz for JetStream", nats.HealthCheck.Test)
	}
	if !strings.HasPrefix(nats.Image, "nats:") || !strings.HasSuffix(nats.Image, "-alpine") {
		t.Errorf("nats image %s: the health check needs the alpine variant's wget", nats.Image)
	}
	checkVolume(t, p, "nats", "/data")
	ch := p.Services["clickhouse"]
	if !strings.HasPrefix(ch.Image, "clickhouse/clickhouse-server:") {
		t.Errorf("clickhouse image %s, want the official clickhouse/clickhouse-server", ch.Image)
	}
	checkVolume(t, p, "clickhouse", "/var/lib/clickhouse")
	checkVolume(t, p, "grafana", "/var/lib/grafana")

	// gpuwatch reserves the NVIDIA GPUs, with the utility capability NVML needs.
	g := p.Services["gpuwatch"]
	if g.Deploy == nil || g.Deploy.Resources.Reservations == nil || len(g.Deploy.Resources.Reservations.Devices) != 1 {
		t.Fatalf("gpuwatch: no device reservation: %+v", g.Deploy)
	}
	dev := g.Deploy.Resources.Reservations.Devices[0]
	if dev.Driver != "nvidia" || !slices.Contains(dev.Capabilities, "gpu") || !slices.Contains(dev.Capabilities, "utility") || dev.Count != -1 {
		t.Errorf("gpuwatch reservation %+v: want driver nvidia, count all, capabilities gpu and utility", dev)
	}
	if g.Environment["GPUWATCH_SOURCE"] == nil || *g.Environment["GPUWATCH_SOURCE"] != "nvml" {
		t.Errorf("gpuwatch (profile gpu) must read NVML")
	}
	for _, name := range []string{"gpuwatch-demo", "gpuwatch-sim"} {
		if v := p.Services[name].Environment["GPUWATCH_SOURCE"]; v == nil || *v != "synthetic" {
			t.Errorf("%s: the demo has no GPU, want GPUWATCH_SOURCE=synthetic", name)
		}
	}

	// Grafana: the ClickHouse plugin and the provisioning mounted from this directory.
	gf := p.Services["grafana"]
	if v := gf.Environment["GF_PLUGINS_PREINSTALL_SYNC"]; v == nil || !strings.Contains(*v, "grafana-clickhouse-datasource") {
		t.Errorf("grafana does not install grafana-clickhouse-datasource")
	}
	for _, v := range gf.Volumes {
		if v.Type != types.VolumeTypeBind {
			continue
		}
		if _, err := os.Stat(v.Source); err != nil {
			t.Errorf("grafana mounts %s, which is missing: %v", v.Source, err)
		}
	}
}

func checkVolume(t *testing.T, p *types.Project, service, target string) {
	t.Helper()
	for _, v := range p.Services[service].Volumes {
		if v.Target == target && v.Type == types.VolumeTypeVolume {
			if _, ok := p.Volumes[v.Source]; !ok {
				t.Errorf("%s: volume %s is not declared", service, v.Source)
			}
			return
		}
	}
	t.Errorf("%s: no named volume at %s", service, target)
}

// TestComposeVariables checks that every variable compose.yaml sets for a tokenscope
// service is one its configuration reads (a misspelt variable would be silently ignored),
// that HTTP_ADDR listens on all interfaces on the port the health check probes, that
// every flag given to an emitter subcommand exists, and that the README lists them.
func TestComposeVariables(t *testing.T) {
	p := loadCompose(t, nil)
	src := srcconfig.NewReader(repoRoot)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	subcommands := map[string]string{"replay": "runReplay", "fakellm": "runFakeLLM", "bench": "runBench"}
	checked := 0
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		svc := tokenscopeService(s)
		if svc == "" {
			continue
		}
		checked++
		if s.Build == nil || s.Build.Dockerfile != "deploy/docker/"+svc+".Dockerfile" {
			t.Errorf("%s: image tokenscope/%s is not built from deploy/docker/%s.Dockerfile", name, svc, svc)
		}
		known := envVars(t, src, svc)
		svcReadme, err := os.ReadFile(filepath.Join(repoRoot, "services", svc, "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range s.Environment {
			// An OpenTelemetry SDK variable is read by the SDK, not by tokenscope's code:
			// the service's README must say that it reads it.
			sdk := strings.HasPrefix(k, "OTEL_") && strings.Contains(string(svcReadme), "`"+k+"`")
			if _, ok := known[k]; !ok && !sdk {
				t.Errorf("%s sets %s, which services/%s does not read", name, k, svc)
			}
			if !strings.Contains(string(readme), "`"+k+"`") {
				t.Errorf("%s sets %s, which deploy/README.md does not list", name, k)
			}
			if v == nil {
				t.Errorf("%s: %s has no value", name, k)
			}
		}
		if len(s.Command) > 0 {
			fn, ok := subcommands[s.Command[0]]
			if !ok || svc != "emitter" {
				t.Errorf("%s: command %v is not an emitter subcommand", name, s.Command)
				continue
			}
			flags, err := src.Flags("services/emitter", fn)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range s.Command[1:] {
				if !strings.HasPrefix(a, "-") {
					continue
				}
				f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !slices.Contains(flags, f) {
					t.Errorf("%s: emitter %s has no flag -%s", name, s.Command[0], f)
				}
			}
			continue
		}
		// A server: it must listen where other containers and the health check reach it.
		addr := s.Environment["HTTP_ADDR"]
		if addr == nil {
			t.Errorf("%s: HTTP_ADDR is not set (the default listens on 127.0.0.1 only)", name)
			continue
		}
		host, port, err := net.SplitHostPort(*addr)
		if err != nil || host != "0.0.0.0" {
			t.Errorf("%s: HTTP_ADDR=%s, want 0.0.0.0:<port>", name, *addr)
		}
		if s.HealthCheck == nil {
			continue
		}
		// The emitter's probes have an address of their own, answered while HTTP_ADDR is full.
		if probes := s.Environment["EMITTER_PROBE_ADDR"]; probes != nil {
			if host, port, err = net.SplitHostPort(*probes); err != nil || host != "0.0.0.0" {
				t.Errorf("%s: EMITTER_PROBE_ADDR=%s, want 0.0.0.0:<port>", name, *probes)
			}
		}
		probe := s.HealthCheck.Test[len(s.HealthCheck.Test)-1]
		u, err := url.Parse(probe)
		if err != nil || u.Port() != port || u.Path != "/readyz" || s.HealthCheck.Test[1] != "/usr/local/bin/httpprobe" {
			t.Errorf("%s: health check %v does not probe /readyz on the port %s of its probes with httpprobe", name, s.HealthCheck.Test, port)
		}
	}
	if checked < 8 {
		t.Fatalf("only %d tokenscope services checked", checked)
	}
}

// TestComposeSettings checks the TOKENSCOPE_* knobs reach the services, and that every one
// the file reads is documented.
func TestComposeSettings(t *testing.T) {
	p := loadCompose(t, map[string]string{
		"TOKENSCOPE_UPSTREAM_URL":        "https://api.openai.com",
		"TOKENSCOPE_CLICKHOUSE_PASSWORD": "s3cret",
		"TOKENSCOPE_AGG_WINDOW":          "30s",
		"TOKENSCOPE_GPU_HOST":            "vllm-0:8000",
		"TOKENSCOPE_VERSION":             "1.2.3",
	})
	get := func(svc, k string) string {
		v := p.Services[svc].Environment[k]
		if v == nil {
			t.Fatalf("%s: %s not set", svc, k)
		}
		return *v
	}
	checks := []struct{ svc, key, want string }{
		{"emitter", "EMITTER_UPSTREAM_URL", "https://api.openai.com"},
		{"aggregator", "CLICKHOUSE_PASSWORD", "s3cret"},
		{"alerter", "CLICKHOUSE_PASSWORD", "s3cret"},
		{"clickhouse", "CLICKHOUSE_PASSWORD", "s3cret"},
		{"grafana", "CLICKHOUSE_PASSWORD", "s3cret"},
		{"aggregator", "AGG_WINDOW", "30s"},
		{"gpuwatch", "GPUWATCH_HOST", "vllm-0:8000"},
		{"aggregator", "NATS_URL", "nats://nats:4222"},
		{"aggregator", "CLICKHOUSE_ADDR", "clickhouse:9000"},
	}
	for _, c := range checks {
		if got := get(c.svc, c.key); got != c.want {
			t.Errorf("%s %s = %q, want %q", c.svc, c.key, got, c.want)
		}
	}
	if img := p.Services["aggregator"].Image; img != "tokenscope/aggregator:1.2.3" {
		t.Errorf("image %s, want TOKENSCOPE_VERSION as the tag", img)
	}
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Split(string(raw), "${")[1:] {
		name := f[:strings.IndexAny(f, ":}")]
		if !strings.Contains(string(readme), "`"+name+"`") {
			t.Errorf("compose.yaml reads %s, which deploy/README.md does not list", name)
		}
	}
}

// TestComposeUpstream: compose.yaml's emitter has no upstream until TOKENSCOPE_UPSTREAM_URL
// names one: without it the proxy is off (none), and the real emitter takes that setting and
// goes on to NATS, rather than proxying every request to nothing (an empty
// EMITTER_UPSTREAM_URL would be the emitter's own default, 127.0.0.1:8081 in its container).
// The demo files point it at the fake LLM and leave no per-model route, whatever
// TOKENSCOPE_UPSTREAM_URL and TOKENSCOPE_UPSTREAMS say, so that the demo's load stays off
// real APIs.
func TestComposeUpstream(t *testing.T) {
	bin := buildService(t, t.TempDir(), "emitter")
	for _, environ := range []map[string]string{nil, {"TOKENSCOPE_UPSTREAM_URL": ""}} {
		em := loadCompose(t, environ).Services["emitter"]
		env := map[string]string{}
		for k, v := range em.Environment {
			if v != nil {
				env[k] = *v
			}
		}
		if env["EMITTER_UPSTREAM_URL"] != "none" {
			t.Errorf("TOKENSCOPE_UPSTREAM_URL=%q: EMITTER_UPSTREAM_URL=%q, want none (the proxy off)", environ["TOKENSCOPE_UPSTREAM_URL"], env["EMITTER_UPSTREAM_URL"])
		}
		env["NATS_URL"] = "nats://127.0.0.1:1" // stop it at its first step past the settings
		out := runEmitter(t, bin, nil, env)
		if !strings.Contains(out, "cannot connect to NATS") || strings.Contains(out, "EMITTER_UPSTREAM") {
			t.Errorf("TOKENSCOPE_UPSTREAM_URL=%q: the emitter did not take its upstream setting and go on to NATS:\n%s",
				environ["TOKENSCOPE_UPSTREAM_URL"], out)
		}
	}
	for _, environ := range []map[string]string{nil, {"TOKENSCOPE_UPSTREAMS": "llama-=https://api.example.com"}} {
		demo := loadComposeFiles(t, environ, demoFiles...)
		if r := demo.Services["emitter"].Environment["EMITTER_UPSTREAMS"]; r != nil && *r != "" {
			t.Errorf("demo, TOKENSCOPE_UPSTREAMS=%q: EMITTER_UPSTREAMS=%q, want no route", environ["TOKENSCOPE_UPSTREAMS"], *r)
		}
	}
	for _, environ := range []map[string]string{nil, {"TOKENSCOPE_UPSTREAM_URL": "https://api.openai.com"}} {
		demo := loadComposeFiles(t, environ, demoFiles...)
		if up := demo.Services["emitter"].Environment["EMITTER_UPSTREAM_URL"]; up == nil || *up != "http://fakellm:8081" {
			t.Errorf("demo, TOKENSCOPE_UPSTREAM_URL=%q: EMITTER_UPSTREAM_URL=%v, want the fake LLM, http://fakellm:8081",
				environ["TOKENSCOPE_UPSTREAM_URL"], up)
		}
	}
}
