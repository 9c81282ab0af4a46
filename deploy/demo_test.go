package deploy

import (
	"encoding/json"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
)

// runEmitter runs the emitter binary with args and exactly environ, and returns its
// output; it fails the test if the command succeeded (every run here is stopped on
// purpose before it would serve or replay).
func runEmitter(t *testing.T, bin string, args []string, environ map[string]string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	for k, v := range environ {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("emitter %v ran to its end; want it stopped before it serves or replays:\n%s", args, out)
	}
	return string(out)
}

// commandCheck runs a compose service's emitter command through the emitter's own flag set
// and the checks that follow it, stopping it on purpose at the first step after them:
// replay is made to publish with a publisher setting that does not parse (its flags are
// all read and checked before it reads the publisher's settings, which includes the
// service's own environment), fakellm to listen where something already listens (after its
// flags, its OTLP endpoint and its resource from OTEL_RESOURCE_ATTRIBUTES). It returns the
// output and whether the run reached that step, so every flag, value and setting passed.
func commandCheck(t *testing.T, bin string, command []string, environ map[string]string, busy string) (string, bool) {
	t.Helper()
	env := map[string]string{}
	for k, v := range environ {
		env[k] = v
	}
	args := slices.Clone(command)
	var want string
	switch command[0] {
	case "replay":
		args = append(args, "-publish")
		env["EMITTER_PUBLISH_BUFFER"] = "not-a-number"
		want = "EMITTER_PUBLISH_BUFFER"
	case "fakellm":
		args = append(args, "-addr", busy)
		want = "cannot listen on " + busy
	default:
		t.Fatalf("no check for emitter %s", command[0])
	}
	out := runEmitter(t, bin, args, env)
	return out, strings.Contains(out, want)
}

// TestComposeCommands runs each emitter command of compose.yaml (the demo profile's fake
// LLM and loads) with the service's environment through the real emitter binary, built as
// its Dockerfile builds it: a misspelt flag, a value of the wrong type or out of bounds, or
// a setting that does not parse fails here, as it would make the container exit.
func TestComposeCommands(t *testing.T) {
	p := loadCompose(t, map[string]string{"TOKENSCOPE_INGEST_TOKEN": "t0ken"})
	bin := buildService(t, t.TempDir(), "emitter")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()

	environ := func(s types.ServiceConfig) map[string]string {
		env := map[string]string{}
		for k, v := range s.Environment {
			if v != nil {
				env[k] = *v
			}
		}
		return env
	}
	ran := map[string]bool{}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		if len(s.Command) == 0 || tokenscopeService(s) != "emitter" {
			continue
		}
		ran[s.Command[0]] = true
		if out, ok := commandCheck(t, bin, s.Command, environ(s), busy); !ok {
			t.Errorf("%s: emitter %s refuses the command or the environment compose.yaml gives it:\n%v\n%s", name, s.Command[0], s.Command, out)
		}
	}
	if !ran["replay"] || !ran["fakellm"] {
		t.Fatalf("emitter commands checked: %v, want replay and fakellm", ran)
	}
	// The proxied load carries the recurring burst that overruns the fake engine's batch.
	if flagValue(p.Services["load"].Command, "-burst") == "" {
		t.Fatalf("the load's command %v has no -burst: the demo's engine queue would stay empty", p.Services["load"].Command)
	}

	// The check tells a bad command from a good one.
	load := p.Services["load"]
	burst := flagValue(load.Command, "-burst")
	for _, bad := range []struct{ what, flag, value string }{
		{"a misspelt flag", "-turns", "-turn"},
		{"a value of the wrong type", "4", "four"},
		{"a value out of bounds", "0.3", "1.5"},
		{"a burst that does not end before the next", burst, "at=2m,for=5m,every=5m"},
		{"a misspelt part of the burst", burst, "client=192"},
	} {
		cmd := slices.Clone(load.Command)
		i := slices.Index(cmd, bad.flag)
		if i < 0 {
			t.Fatalf("the load's command %v has no %s", cmd, bad.flag)
		}
		cmd[i] = bad.value
		if out, ok := commandCheck(t, bin, cmd, environ(load), busy); ok {
			t.Errorf("%s (%v) passed the check:\n%s", bad.what, cmd, out)
		}
	}
	env := environ(p.Services["fakellm"])
	env["OTEL_RESOURCE_ATTRIBUTES"] = "no-equals-sign"
	if out, ok := commandCheck(t, bin, p.Services["fakellm"].Command, env, busy); ok {
		t.Errorf("a malformed OTEL_RESOURCE_ATTRIBUTES passed the check:\n%s", out)
	}
}

// flagValue returns the value given to flag in a command (-flag value or -flag=value).
func flagValue(cmd []string, flag string) string {
	for i, a := range cmd {
		if a == flag && i+1 < len(cmd) {
			return cmd[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}

// demoFiles are the compose files the demo runs with: compose.yaml and the override that
// gives the aggregator the demo's prices.
var demoFiles = []string{"compose.yaml", "compose.demo.yaml"}

// TestComposePrices: compose.yaml's aggregator reads a price table mounted read-only from
// deploy/prices.json (or TOKENSCOPE_PRICES), which prices no model, so that a deployment
// serving a model of one of the demo's names is never charged the demo's made-up prices.
// The demo's prices come with compose.demo.yaml: deploy/prices.demo.json, mounted in its
// place, which parses as the aggregator parses it and prices every model the demo profile's
// loads and fake engine name. compose.demo.yaml changes nothing else.
func TestComposePrices(t *testing.T) {
	base := loadCompose(t, nil)
	if prices := priceTable(t, base, "prices.json"); len(prices) > 0 {
		t.Errorf("compose.yaml's own price table deploy/prices.json prices %d models (%s…): "+
			"a deployment serving a model of that name would get made-up prices; want it empty", len(prices), prices[0].Model)
	}
	own := loadCompose(t, map[string]string{"TOKENSCOPE_PRICES": "/srv/tokenscope/prices.json"})
	priceMount(t, own, "/srv/tokenscope/prices.json")

	demo := loadComposeFiles(t, nil, demoFiles...)
	prices := priceTable(t, demo, "prices.demo.json")
	models := map[string]string{}
	for _, name := range demo.ServiceNames() {
		s := demo.Services[name]
		if !slices.Contains(s.Profiles, "demo") || len(s.Command) == 0 {
			continue
		}
		for _, f := range []string{"-model", "-model-name"} {
			if m := flagValue(s.Command, f); m != "" {
				models[m] = name
			}
		}
	}
	if len(models) < 2 {
		t.Fatalf("models of the demo profile: %v, want the proxied load's and the simulated one's", models)
	}
	for m, svc := range models {
		priced := slices.ContainsFunc(prices, func(pr priceRow) bool {
			ok, _ := path.Match(pr.Model, m)
			return ok
		})
		if !priced {
			t.Errorf("%s's model %s has no price in deploy/prices.demo.json", svc, m)
		}
	}

	// compose.demo.yaml replaces the price table's mount and the emitter's upstreams (the fake
	// LLM, no per-model route: TestComposeUpstream), and nothing else.
	target := *base.Services["aggregator"].Environment["AGG_PRICES"]
	others := func(s types.ServiceConfig) types.ServiceConfig {
		s.Volumes = slices.DeleteFunc(slices.Clone(s.Volumes), func(v types.ServiceVolumeConfig) bool { return v.Target == target })
		s.Environment = maps.Clone(s.Environment)
		delete(s.Environment, "EMITTER_UPSTREAM_URL")
		delete(s.Environment, "EMITTER_UPSTREAMS")
		return s
	}
	for _, name := range base.ServiceNames() {
		if !reflect.DeepEqual(others(base.Services[name]), others(demo.Services[name])) {
			t.Errorf("compose.demo.yaml changes %s beyond the price table's mount and the emitter's upstreams", name)
		}
	}
	if !slices.Equal(base.ServiceNames(), demo.ServiceNames()) || !reflect.DeepEqual(base.Volumes, demo.Volumes) {
		t.Errorf("compose.demo.yaml adds services or volumes")
	}
}

// priceMount returns AGG_PRICES's file, checking that it is a read-only bind mount of
// source (relative to this directory) into the aggregator.
func priceMount(t *testing.T, p *types.Project, source string) string {
	t.Helper()
	agg := p.Services["aggregator"]
	file := agg.Environment["AGG_PRICES"]
	if file == nil || *file == "" {
		t.Fatal("the aggregator has no AGG_PRICES")
	}
	var got string
	n := 0
	for _, v := range agg.Volumes {
		if v.Target != *file {
			continue
		}
		if n++; v.Type == types.VolumeTypeBind && v.ReadOnly {
			got = v.Source
		}
	}
	if got == "" || n != 1 {
		t.Fatalf("AGG_PRICES=%s is not one read-only file mounted into the aggregator (%d mounts there)", *file, n)
	}
	want, err := filepath.Abs(source)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("the price table is mounted from %s, want %s", got, want)
	}
	return got
}

// priceTable reads the price table p mounts as the aggregator's AGG_PRICES, which must be
// file of this directory, as the aggregator parses it (no unknown fields, a pattern and no
// negative price in each row).
func priceTable(t *testing.T, p *types.Project, file string) []priceRow {
	t.Helper()
	source := priceMount(t, p, file)
	raw, err := os.ReadFile(source)
	if err != nil {
		t.Fatal(err)
	}
	var prices []priceRow
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&prices); err != nil || prices == nil {
		t.Fatalf("%s: %v, want a JSON array", source, err)
	}
	for i, pr := range prices {
		if _, err := path.Match(pr.Model, ""); pr.Model == "" || err != nil {
			t.Errorf("%s: entry %d: bad model pattern %q", source, i+1, pr.Model)
		}
		if pr.Input == nil || pr.Output == nil || *pr.Input < 0 || *pr.Output < 0 || (pr.CachedInput != nil && *pr.CachedInput < 0) {
			t.Errorf("%s: entry %d (%s) lacks an input or output price, or has a negative one", source, i+1, pr.Model)
		}
	}
	return prices
}

// priceRow is a row of the aggregator's price table (AGG_PRICES).
type priceRow struct {
	Model       string   `json:"model"`
	Input       *float64 `json:"input"`
	Output      *float64 `json:"output"`
	CachedInput *float64 `json:"cached_input"`
}

// TestComposeLabels: the proxied load's verdicts and the fake engine's spans carry the
// labels the proxy gives the same requests (scene default, env TOKENSCOPE_ENV, instance the
// upstream's host:port), so that verdicts, engine-layer and gateway-layer events of one
// request fall in one series.
func TestComposeLabels(t *testing.T) {
	p := loadComposeFiles(t, map[string]string{"TOKENSCOPE_ENV": "staging"}, demoFiles...)
	em := p.Services["emitter"].Environment
	env := *em["EMITTER_DEFAULT_ENV"]
	scene := "default" // EMITTER_DEFAULT_SCENE's default: compose.yaml does not set it
	if v := em["EMITTER_DEFAULT_SCENE"]; v != nil {
		scene = *v
	}
	if env != "staging" {
		t.Fatalf("EMITTER_DEFAULT_ENV=%s, want TOKENSCOPE_ENV", env)
	}
	load := p.Services["load"].Command
	if got := flagValue(load, "-scene"); got != scene {
		t.Errorf("load -scene %q, want the proxy's default scene %q", got, scene)
	}
	if got := flagValue(load, "-env"); got != env {
		t.Errorf("load -env %q, want the proxy's default env %q", got, env)
	}
	attrs := p.Services["fakellm"].Environment["OTEL_RESOURCE_ATTRIBUTES"]
	if attrs == nil {
		t.Fatal("fakellm: no OTEL_RESOURCE_ATTRIBUTES: its engine-layer events would be labelled by its container's name")
	}
	for _, want := range []string{"tokenscope.scene=" + scene, "deployment.environment.name=" + env, "service.instance.id=fakellm:8081"} {
		if !slices.Contains(strings.Split(*attrs, ","), want) {
			t.Errorf("fakellm OTEL_RESOURCE_ATTRIBUTES=%s lacks %s", *attrs, want)
		}
	}
	if up := *em["EMITTER_UPSTREAM_URL"]; up != "http://fakellm:8081" {
		t.Errorf("EMITTER_UPSTREAM_URL=%s, want the fake LLM at fakellm:8081", up)
	}
	if h := *p.Services["gpuwatch-demo"].Environment["GPUWATCH_HOST"]; h != "fakellm:8081" {
		t.Errorf("gpuwatch-demo GPUWATCH_HOST=%s, want fakellm:8081", h)
	}
}

// TestComposePorts: every published port is bound to 127.0.0.1 unless TOKENSCOPE_BIND says
// otherwise.
func TestComposePorts(t *testing.T) {
	for _, bind := range []string{"", "0.0.0.0"} {
		env := map[string]string{}
		want := "127.0.0.1"
		if bind != "" {
			env["TOKENSCOPE_BIND"], want = bind, bind
		}
		p := loadCompose(t, env)
		n := 0
		for _, name := range p.ServiceNames() {
			for _, port := range p.Services[name].Ports {
				n++
				if port.HostIP != want {
					t.Errorf("TOKENSCOPE_BIND=%q: %s publishes %s on %q, want %s", bind, name, port.Published, port.HostIP, want)
				}
			}
		}
		if n < 8 {
			t.Fatalf("only %d published ports", n)
		}
	}
}

// TestComposeSecrets: no secret the compose file is given reaches a command line (a
// container's command or health check, which every user of the host can read in ps), and
// each goes to its service by the environment only.
func TestComposeSecrets(t *testing.T) {
	secrets := map[string]string{
		"TOKENSCOPE_CLICKHOUSE_PASSWORD": "ch-s3cret",
		"TOKENSCOPE_INGEST_TOKEN":        "ingest-s3cret",
		"TOKENSCOPE_GRAFANA_PASSWORD":    "gf-s3cret",
	}
	// The variables that hold them inside the containers.
	names := []string{"CLICKHOUSE_PASSWORD", "EMITTER_INGEST_TOKEN", "GF_SECURITY_ADMIN_PASSWORD"}
	p := loadCompose(t, maps.Clone(secrets)) // the loader adds to the map it is given
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		argv := slices.Concat(s.Entrypoint, s.Command)
		if s.HealthCheck != nil {
			argv = append(argv, s.HealthCheck.Test...)
		}
		line := strings.Join(argv, " ")
		for knob, v := range secrets {
			if strings.Contains(line, v) {
				t.Errorf("%s: %s is on a command line: %s", name, knob, line)
			}
		}
		for _, n := range names {
			if strings.Contains(line, "$"+n) || strings.Contains(line, "${"+n) {
				t.Errorf("%s: $%s is expanded onto a command line: %s", name, n, line)
			}
		}
		if strings.Contains(line, "--password") {
			t.Errorf("%s: a password flag on a command line: %s", name, line)
		}
	}
	for _, c := range []struct{ svc, key, knob string }{
		{"fakellm", "EMITTER_INGEST_TOKEN", "TOKENSCOPE_INGEST_TOKEN"},
		{"load", "EMITTER_INGEST_TOKEN", "TOKENSCOPE_INGEST_TOKEN"},
		{"emitter", "EMITTER_INGEST_TOKEN", "TOKENSCOPE_INGEST_TOKEN"},
		{"clickhouse", "CLICKHOUSE_PASSWORD", "TOKENSCOPE_CLICKHOUSE_PASSWORD"},
	} {
		if v := p.Services[c.svc].Environment[c.key]; v == nil || *v != secrets[c.knob] {
			t.Errorf("%s: %s does not carry %s", c.svc, c.key, c.knob)
		}
	}
}

// TestReadmeComposeCommands: every docker compose command the root README and this
// directory's README show names files that exist (from the repository root, where the
// READMEs run them), profiles and services compose.yaml has, and a compose subcommand; one
// that starts the demo profile gives compose.demo.yaml too, the demo's prices.
func TestReadmeComposeCommands(t *testing.T) {
	p := loadCompose(t, nil)
	profiles := map[string]bool{}
	for _, s := range p.Services {
		for _, pr := range s.Profiles {
			profiles[pr] = true
		}
	}
	subcommands := map[string]bool{"up": true, "down": true, "stop": true, "start": true, "restart": true,
		"ps": true, "logs": true, "config": true, "pull": true, "build": true}
	n := 0
	for _, doc := range []string{filepath.Join(repoRoot, "README.md"), "README.md"} {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			line, _, _ = strings.Cut(line, "#")
			w := strings.Fields(line)
			if len(w) < 2 || w[0] != "docker" || w[1] != "compose" {
				continue
			}
			n++
			files, sub := 0, ""
			demo, demoPrices := false, false
			for i := 2; i < len(w) && sub == ""; i++ {
				switch a := w[i]; {
				case (a == "-f" || a == "--profile") && i+1 < len(w):
					v := w[i+1]
					i++
					if a == "--profile" {
						if !profiles[v] {
							t.Errorf("%s: %q: compose.yaml has no profile %s", doc, line, v)
						}
						demo = demo || v == "demo"
						continue
					}
					files++
					demoPrices = demoPrices || v == "deploy/"+demoFiles[1]
					if _, err := os.Stat(filepath.Join(repoRoot, v)); err != nil && !strings.HasSuffix(v, "compose.override.yaml") {
						t.Errorf("%s: %q: %v", doc, line, err)
					}
				case strings.HasPrefix(a, "-"):
					t.Errorf("%s: %q: %s before the subcommand", doc, line, a)
				default:
					sub = a
				}
			}
			if files == 0 || !subcommands[sub] {
				t.Errorf("%s: %q: want -f deploy/compose.yaml and a compose subcommand, got %q", doc, line, sub)
			}
			// compose.yaml prices no model: the demo's costs need its override.
			if demo && sub == "up" && !demoPrices {
				t.Errorf("%s: %q: the demo profile without -f deploy/%s prices none of its requests", doc, line, demoFiles[1])
			}
		}
	}
	if n < 4 {
		t.Fatalf("only %d docker compose commands found in the READMEs", n)
	}
}

// TestComposeDollars: docker compose interpolates $NAME and ${NAME} in compose.yaml from the
// shell of whoever runs it, and $$ stands for a $ left to the container. Every $ of the file
// is a TOKENSCOPE_* knob or $$, and the ClickHouse health check's $HOSTNAME and
// $CLICKHOUSE_DB reach the container's shell as written, whatever the host's shell holds:
// the container's own name (which docker sets) and the database its environment names.
func TestComposeDollars(t *testing.T) {
	raw, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(raw), "\n") {
		rest := composeKnob.ReplaceAllStringFunc(line, func(k string) string {
			if strings.HasPrefix(composeKnob.FindStringSubmatch(k)[1], "TOKENSCOPE_") {
				return ""
			}
			return k
		})
		rest = strings.ReplaceAll(rest, "$$", "")
		if strings.Contains(rest, "$") {
			t.Errorf("compose.yaml:%d: a $ that compose interpolates from the host's shell: %s", i+1, strings.TrimSpace(line))
		}
	}
	p := loadCompose(t, map[string]string{"HOSTNAME": "the-host", "CLICKHOUSE_DB": "the-hosts-db"})
	ch := p.Services["clickhouse"]
	test := strings.Join(ch.HealthCheck.Test, " ")
	for _, want := range []string{`--host "$HOSTNAME"`, `--database "$CLICKHOUSE_DB"`} {
		if !strings.Contains(test, want) {
			t.Errorf("clickhouse health check %q: want %s, expanded in the container", test, want)
		}
	}
	if v := ch.Environment["CLICKHOUSE_DB"]; v == nil || *v != "tokenscope" {
		t.Errorf("clickhouse: CLICKHOUSE_DB %v, want the knob's default tokenscope", v)
	}
	if _, ok := ch.Environment["HOSTNAME"]; ok {
		t.Errorf("clickhouse: HOSTNAME is set; docker sets it to the container's name, which resolves to its address")
	}
}
