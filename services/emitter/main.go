// Command emitter is tokenscope's edge: with no arguments it serves the LLM gateway proxy,
// the HTTP ingest and /metrics; bench, replay and fakellm are its subcommands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "emitter:", err)
		os.Exit(1)
	}
}
