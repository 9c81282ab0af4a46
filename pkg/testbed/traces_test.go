package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTracesDir(t *testing.T) {
	t.Setenv(TracesEnv, "")
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// The working folder is pkg/testbed in the checkout: go.work is two levels up.
	want := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(wd))), "shared", "traces")
	if got := TracesDir(); got != want {
		t.Fatalf("TracesDir() = %q, want %q", got, want)
	}
	t.Setenv(TracesEnv, "/somewhere/else")
	if got := TracesDir(); got != "/somewhere/else" {
		t.Fatalf("TracesDir() = %q with %s set", got, TracesEnv)
	}
}

func TestTracePath(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.csv"), []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "d.csv"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(TracesEnv, dir)
	for _, tt := range []struct {
		name, file, wantErr string
	}{
		{"present", "a.csv", ""},
		{"absent", "b.csv", "trace b.csv not found"},
		{"folder", "d.csv", "is not a file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tracePath(tt.file)
			if tt.wantErr == "" {
				if err != nil || got != filepath.Join(dir, tt.file) {
					t.Fatalf("tracePath = %q, %v", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("tracePath error %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestTraceSkipsOrFails runs Trace for a missing file in a child test: locally it skips,
// under CI=true it fails, and either way it says where the traces come from.
func TestTraceSkipsOrFails(t *testing.T) {
	t.Setenv(TracesEnv, t.TempDir())
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		ft := &fakeTB{TB: t}
		func() {
			defer func() { recover() }() // SkipNow and FailNow stop the goroutine; fakeTB panics instead
			Trace(ft, "AzureLLMInferenceTrace_conv.csv")
		}()
		if ci == "true" && (!ft.failed || ft.skipped) || ci == "" && (!ft.skipped || ft.failed) {
			t.Fatalf("CI=%q: failed %v, skipped %v", ci, ft.failed, ft.skipped)
		}
		if !strings.Contains(ft.msg, "github.com/Azure/AzurePublicDataset") || !strings.Contains(ft.msg, TracesEnv) {
			t.Fatalf("CI=%q: message %q does not say where the traces come from", ci, ft.msg)
		}
	}
}

type fakeTB struct {
	testing.TB
	failed, skipped bool
	msg             string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	panic("fatal")
}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, fmt.Sprintf(format, args...)
	panic("skip")
}
