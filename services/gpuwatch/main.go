// Command gpuwatch samples every GPU of its host through NVML and publishes GPU samples to
// gpu.sample.<host> on NATS JetStream; see README.md.
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
	err := run(ctx, os.Getenv, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuwatch:", err)
		os.Exit(1)
	}
}
