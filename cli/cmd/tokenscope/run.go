package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

const usage = `usage: tokenscope <command> [flags]

commands:
  demo     run NATS, ClickHouse, the four services, a fake LLM and a load on this machine,
           and show the per-bucket table live with alerts as they fire (Ctrl-C stops all)
  report   print the per-bucket table (P50/P95/P99 TTFT and TPOT, tokens/s, errors vs
           timeouts) from ClickHouse for a time range, or compare two ranges

tokenscope <command> -h lists the command's flags.
`

// run dispatches a subcommand; main makes the context and exits on error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	var err error
	switch args[0] {
	case "demo":
		err = runDemo(ctx, args[1:], getenv, stdout, stderr)
	case "report":
		err = runReport(ctx, args[1:], getenv, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}
