package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/demo"
	"github.com/tokenscope/tokenscope/cli/internal/stack"
)

// defaultTrace is the Azure conversation trace the proxied load replays when it is in the
// traces folder: TOKENSCOPE_TRACES, else ../shared/traces beside the checkout.
const defaultTrace = "AzureLLMInferenceTrace_conv.csv"

// tracesDir is the folder the demo looks in for the Azure traces.
func tracesDir(root string, getenv func(string) string) string {
	if d := getenv("TOKENSCOPE_TRACES"); d != "" {
		return d
	}
	return filepath.Join(filepath.Dir(root), "shared", "traces")
}

func parseDemoArgs(args []string, root, traces string, isTTY bool, stderr io.Writer) (demo.Options, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := demo.Options{Root: root, TTY: isTTY}
	fs.StringVar(&o.Dir, "dir", filepath.Join(os.TempDir(), "tokenscope-demo"), "state folder: ClickHouse and NATS data (fresh each run), logs, stack.env")
	fs.StringVar(&o.BinDir, "bin", filepath.Join(root, "bin"), "folder of the service binaries")
	fs.BoolVar(&o.Build, "build", true, "go build the services into --bin first (false: use the binaries there, e.g. from make build)")
	fs.BoolVar(&o.AnyPort, "any-port", false, "listen on free ports instead of the services' defaults (4222, 9000, 8080, …)")
	fs.StringVar(&o.GPU, "gpu", "auto", "gpuwatch source: auto (NVML when a GPU answers, else synthetic), nvml, synthetic or off")
	trace := filepath.Join(traces, defaultTrace)
	if st, err := os.Stat(trace); err != nil || !st.Mode().IsRegular() {
		trace = ""
	}
	fs.StringVar(&o.Trace, "trace", trace, "Azure trace CSV replayed through the proxy (default: "+defaultTrace+" in TOKENSCOPE_TRACES or ../shared/traces, when there); empty: a generated workload shaped like it")
	fs.Float64Var(&o.Speed, "speed", 1, "replay speed of the proxied load (1: as recorded, about 5 requests/s)")
	fs.DurationVar(&o.Window, "window", 10*time.Second, "aggregation window (AGG_WINDOW)")
	fs.DurationVar(&o.View, "view", 5*time.Minute, "the live table covers this much of the recent past")
	fs.DurationVar(&o.Refresh, "refresh", 3*time.Second, "how often the table is redrawn")
	plain := fs.Bool("plain", false, "print table after table instead of redrawing the screen")
	fs.Func("incident", "when the load burst beyond the fake engine's batch runs: at=40s,for=40s,every=2m (the default)", func(v string) error {
		in, err := demo.ParseIncident(v)
		o.Incident = in
		return err
	})
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: tokenscope demo [flags]\n\nRuns the whole stack on this machine (needs clickhouse-server and Go) and shows it live.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	if *plain {
		o.TTY = false
	}
	return o, o.Validate()
}

func runDemo(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	wd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("cannot read the working folder: %w", err)
	}
	if r := getenv("TOKENSCOPE_ROOT"); r != "" {
		wd = r
	}
	root, err := stack.FindRoot(wd)
	if err != nil {
		return fmt.Errorf("%w: run the demo from the checkout (or set TOKENSCOPE_ROOT)", err)
	}
	o, err := parseDemoArgs(args, root, tracesDir(root, getenv), isTerminal(stdout), stderr)
	if err != nil {
		return err
	}
	return demo.Run(ctx, o, stdout)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
