// Command tokenscope is the command line of tokenscope: demo runs the whole stack on one
// machine and shows it live; report prints the per-bucket table for any time range.
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
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tokenscope:", err)
		os.Exit(1)
	}
}
