package bus_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/caarlos0/env/v11"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

func parse(t *testing.T, vars map[string]string) (bus.Config, error) {
	t.Helper()
	var c struct {
		NATS bus.Config `envPrefix:"NATS_"`
	}
	if err := env.ParseWithOptions(&c, env.Options{Environment: vars}); err != nil {
		return bus.Config{}, err
	}
	return c.NATS, c.NATS.Validate()
}

func TestConfig(t *testing.T) {
	c, err := parse(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.URL != "nats://127.0.0.1:4222" || c.Streams.DuplicateWindow != 2*time.Minute {
		t.Fatalf("defaults: %+v", c)
	}
	for _, tc := range []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"NATS_URL": "::bad"}, "NATS_URL"},
		{map[string]string{"NATS_CREDS": "/x.creds", "NATS_USER": "u"}, "NATS_CREDS"},
		{map[string]string{"NATS_TLS_CERT": "c.pem"}, "NATS_TLS_CERT"},
		{map[string]string{"NATS_STREAM_REPLICAS": "7"}, "NATS_STREAM_REPLICAS"},
		{map[string]string{"NATS_STREAM_MAX_BYTES": "0"}, "NATS_STREAM_MAX_BYTES"},
	} {
		if _, err := parse(t, tc.vars); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%v: error %v does not name %s", tc.vars, err, tc.want)
		}
	}
	// A URL that does not parse still never shows its password.
	for _, u := range []string{"nats://svc:s3cr%zzet@nats:4222", "svc:s3cr et@nats:4222", "nats://svc:s3cr/et@b:4222%,nats://a:4222"} {
		_, err := parse(t, map[string]string{"NATS_URL": u})
		if err == nil || !strings.Contains(err.Error(), "NATS_URL") || strings.Contains(err.Error(), "s3cr") {
			t.Fatalf("NATS_URL=%s: error %v", u, err)
		}
	}
}

func TestEnsureStreamsAndConsumer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv := testbed.NATS(t)
	cfg, err := parse(t, map[string]string{"NATS_URL": srv.ClientURL(), "NATS_STREAM_MAX_BYTES": "67108864"})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := bus.Connect(cfg, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := bus.EnsureStreams(ctx, js, cfg.Streams, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, events.StreamAlerts); err == nil {
		t.Fatal("EnsureStreams with a name created other streams")
	}
	if err := bus.EnsureStreams(ctx, js, cfg.Streams); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{events.StreamEvents, events.StreamGPU, events.StreamEngine, events.StreamHost, events.StreamRollups, events.StreamAlerts, events.StreamFeedback} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		if info.Config.Storage != jetstream.FileStorage || info.Config.MaxBytes != 64<<20 || info.Config.Duplicates != 2*time.Minute {
			t.Fatalf("%s: %+v", name, info.Config)
		}
	}
	// Changing a limit updates the stream in place.
	cfg.Streams.MaxAge = time.Hour
	if err := bus.EnsureStreams(ctx, js, cfg.Streams, events.StreamEvents); err != nil {
		t.Fatal(err)
	}
	s, _ := js.Stream(ctx, events.StreamEvents)
	if s.CachedInfo().Config.MaxAge != time.Hour {
		t.Fatal("MaxAge not updated")
	}
	cons, err := bus.EnsureConsumer(ctx, js, bus.ConsumerConfig{Stream: events.StreamEvents, Durable: "agg", FilterSubject: events.SubjectRequestsAll, MaxAckPending: 100000, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if ci := cons.CachedInfo(); ci.Config.MaxAckPending != 100000 || ci.Config.AckWait != time.Minute {
		t.Fatalf("consumer config %+v", ci.Config)
	}
}
