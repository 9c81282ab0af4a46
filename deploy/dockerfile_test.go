package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	op   string
	args []string
	line string
}

func readDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") || (l == "" && cur.Len() == 0) {
			continue
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(l)
		line := cur.String()
		cur.Reset()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		out = append(out, instruction{op: strings.ToUpper(f[0]), args: f[1:], line: line})
	}
	return out
}

// TestDockerfiles checks each image's Dockerfile against the tree, since no Docker engine
// builds them here: what it copies exists, it builds its own module alone, CGO is off
// except for gpuwatch, and the static images end on distroless/static.
func TestDockerfiles(t *testing.T) {
	for _, svc := range []string{"emitter", "aggregator", "alerter", "gpuwatch"} {
		t.Run(svc, func(t *testing.T) {
			path := filepath.Join("docker", svc+".Dockerfile")
			ins := readDockerfile(t, path)
			if _, err := os.Stat(path + ".dockerignore"); err != nil {
				t.Errorf("no %s.dockerignore: the whole repository would be the build context", path)
			}
			var froms []string
			builds := 0
			for _, in := range ins {
				switch in.op {
				case "FROM":
					froms = append(froms, in.args[0])
				case "COPY":
					if strings.HasPrefix(in.args[0], "--from=") {
						continue
					}
					for _, src := range in.args[:len(in.args)-1] {
						if strings.HasPrefix(src, "--") {
							continue
						}
						if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
							t.Errorf("COPY %s: %v", src, err)
						}
					}
				case "RUN":
					if !strings.Contains(in.line, "go build") {
						continue
					}
					builds++
					if !strings.Contains(in.line, "cd services/"+svc+" && ") || !strings.Contains(in.line, "GOWORK=off go build") {
						t.Errorf("RUN %q does not build services/%s alone (GOWORK=off)", in.line, svc)
					}
					cgo := "CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags=\"-s -w\" -o /out/" + svc + " ."
					if svc == "gpuwatch" {
						cgo = "CGO_ENABLED=1 GOWORK=off go build -trimpath -ldflags=\"-s -w\" -o /out/gpuwatch ."
					}
					if !strings.Contains(in.line, cgo) {
						t.Errorf("RUN %q: want %q", in.line, cgo)
					}
					if !strings.Contains(in.line, "CGO_ENABLED=0 GOWORK=off go build -trimpath -ldflags=\"-s -w\" -o /out/httpprobe ./cmd/httpprobe") {
						t.Errorf("RUN %q does not build httpprobe statically", in.line)
					}
				case "ENTRYPOINT":
					if want := `["/usr/local/bin/` + svc + `"]`; strings.Join(in.args, " ") != want {
						t.Errorf("ENTRYPOINT %v, want %s", in.args, want)
					}
				}
			}
			copied := map[string]bool{}
			for _, in := range ins {
				if in.op == "COPY" && len(in.args) == 2 {
					copied[in.args[0]] = true
				}
			}
			for _, dir := range []string{"pkg/", "schemas/", "services/" + svc + "/", "deploy/cmd/httpprobe/"} {
				if !copied[dir] {
					t.Errorf("the build does not copy %s", dir)
				}
			}
			if builds != 1 || len(froms) != 2 || !strings.HasPrefix(froms[0], "golang:") {
				t.Fatalf("want one golang build stage with one go build, then the image: FROM %v, %d builds", froms, builds)
			}
			final := froms[len(froms)-1]
			switch {
			case svc == "gpuwatch" && !strings.HasPrefix(final, "debian:") && !strings.HasPrefix(final, "nvidia/cuda:"):
				t.Errorf("gpuwatch needs glibc for NVML, final stage %s", final)
			case svc != "gpuwatch" && !strings.HasPrefix(final, "gcr.io/distroless/static"):
				t.Errorf("final stage %s, want distroless/static", final)
			}
		})
	}
}
