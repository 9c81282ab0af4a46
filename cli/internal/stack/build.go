package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Services are the service binaries, in the order they start.
var Services = []string{"aggregator", "alerter", "gpuwatch", "emitter"}

// FindRoot walks up from dir to the tokenscope checkout: the folder whose go.work lists
// the services.
func FindRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("cannot resolve %s: %w", dir, err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.work")); err == nil && strings.Contains(string(b), "services/emitter") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("%s is not inside a tokenscope checkout (no go.work listing services/emitter above it)", dir)
		}
	}
}

// Build compiles the named services of the checkout at root into binDir with the go
// command, each in its own module. gpuwatch needs cgo (a C compiler); the others are built
// without it.
func Build(ctx context.Context, root, binDir string, names []string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		for _, p := range []string{"/usr/local/go/bin/go", "/usr/lib/go/bin/go"} {
			if _, serr := os.Stat(p); serr == nil {
				goBin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return errors.New("the go command is not installed: get Go 1.26 or later from https://go.dev/dl/")
	}
	binDir, err = filepath.Abs(binDir)
	if err != nil {
		return fmt.Errorf("cannot resolve %s: %w", binDir, err)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return fmt.Errorf("cannot create %s: %w", binDir, err)
	}
	for _, n := range names {
		cmd := exec.CommandContext(ctx, goBin, "build", "-o", filepath.Join(binDir, n), ".")
		cmd.Dir = filepath.Join(root, "services", n)
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
		if n != "gpuwatch" {
			cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			msg := strings.TrimSpace(string(out))
			if n == "gpuwatch" && strings.Contains(msg, "gcc") {
				msg += "\n(gpuwatch uses cgo: install a C compiler with: sudo apt-get install -y gcc libc6-dev)"
			}
			return fmt.Errorf("cannot build %s: %w\n%s", n, err, msg)
		}
	}
	return nil
}
