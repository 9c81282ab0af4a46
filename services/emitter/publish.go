package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

// discard is the publisher of a bench or replay run with -publish=false: events are still
// built and validated, then dropped.
type discard struct{}

func (discard) Publish(string, string, []byte) bool { return true }

// publishing connects to NATS for a bench or replay run, with the same configuration as the
// server, and returns the emitter and a stop function that flushes what is buffered.
func publishing(ctx context.Context, environ map[string]string, enabled bool, stderr io.Writer) (*emit.Emitter, func() error, error) {
	if !enabled {
		return emit.New(discard{}, nil, nil), func() error { return nil }, nil
	}
	cfg, err := parseConfig(environ)
	if err != nil {
		return nil, nil, err
	}
	logger := newLogger(stderr, slog.LevelWarn)
	srv := ops.NewServer(cfg.HTTPAddr, logger) // only for its registry: nothing listens
	pub, nc, err := connectBus(ctx, cfg.NATS, cfg.publisherOptions(), srv, logger)
	if err != nil {
		return nil, nil, err
	}
	pubCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pub.Run(pubCtx) }()
	return emit.New(pub, subject.New(cfg.MaxSubjects, cfg.SubjectIdle, nil), nil), func() error {
		stop()
		err := <-done
		nc.Close()
		return err
	}, nil
}
