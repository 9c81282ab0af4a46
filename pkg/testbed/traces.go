package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TracesEnv names the folder that holds the Azure LLM inference traces
// (AzureLLMInferenceTrace_code.csv and AzureLLMInferenceTrace_conv.csv).
const TracesEnv = "TOKENSCOPE_TRACES"

// TracesSource is where the traces come from.
const TracesSource = "the Azure LLM inference traces are public: get AzureLLMInferenceTrace_code.csv and " +
	"AzureLLMInferenceTrace_conv.csv from the data folder of https://github.com/Azure/AzurePublicDataset " +
	"into ../shared/traces beside the checkout, or set " + TracesEnv + " to the folder holding them"

// TracesDir is the folder the traces are read from: TOKENSCOPE_TRACES when set, else
// ../shared/traces beside the checkout (the folder holding go.work, searched upwards from
// the working folder). It is empty when neither can be found.
func TracesDir() string {
	if d := os.Getenv(TracesEnv); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return filepath.Join(filepath.Dir(d), "shared", "traces")
		}
		if filepath.Dir(d) == d {
			return ""
		}
	}
}

// Trace returns the path of the trace file name (e.g. "AzureLLMInferenceTrace_conv.csv")
// in TracesDir. Call it before starting anything: when the file is missing it skips the
// test saying where the traces come from, and under CI=true it fails instead.
func Trace(t testing.TB, name string) string {
	t.Helper()
	path, err := tracePath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%v; %s", err, TracesSource)
		}
		t.Skipf("%v; %s", err, TracesSource)
	}
	return path
}

func tracePath(name string) (string, error) {
	dir := TracesDir()
	if dir == "" {
		return "", fmt.Errorf("trace %s not found: %s is unset and no go.work above the working folder", name, TracesEnv)
	}
	path := filepath.Join(dir, name)
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("trace %s not found: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("trace %s is not a file", path)
	}
	return path, nil
}
