package main

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/pipeline"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/window"
)

// hostPipeline returns the pipeline from HOST_SAMPLES (the GPU hosts' memory, disks and
// network) to host_rollups. It runs beside the GPU pipeline, under AGG_GPU: both read what
// the GPU hosts send, and of aggregators that partition LLM_EVENTS one alone should.
func hostPipeline(ctx context.Context, js jetstream.JetStream, cfg Config, o pipeline.Options, wcfg window.Config, deps pipeline.Deps) (*pipeline.Pipeline, error) {
	if err := bus.EnsureStreams(ctx, js, cfg.NATS.Streams, events.StreamHost); err != nil {
		return nil, err
	}
	return pipeline.NewHost(ctx, o, wcfg, deps)
}
