package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/envconf"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/aggregator/internal/lease"
)

// Config is the aggregator's configuration, from the environment.
type Config struct {
	HTTPAddr   string      `env:"HTTP_ADDR" envDefault:"127.0.0.1:9103"`
	LogLevel   string      `env:"AGG_LOG_LEVEL" envDefault:"info"`
	NATS       bus.Config  `envPrefix:"NATS_"`
	ClickHouse chdb.Config `envPrefix:"CLICKHOUSE_"`
	Agg        AggConfig   `envPrefix:"AGG_"`
}

// AggConfig holds the AGG_ variables.
type AggConfig struct {
	Window        time.Duration `env:"WINDOW" envDefault:"15s"`
	Lateness      time.Duration `env:"LATENESS" envDefault:"30s"`
	Buckets       string        `env:"BUCKETS" envDefault:"0,500,2000,8000,32000"`
	Prices        string        `env:"PRICES"` // path of a JSON price table; empty: every model unpriced
	MaxSeries     int           `env:"MAX_SERIES" envDefault:"10000"`
	StoreRequests bool          `env:"STORE_REQUESTS" envDefault:"true"`
	GPU           bool          `env:"GPU" envDefault:"true"`
	Engine        bool          `env:"ENGINE" envDefault:"true"`
	Feedback      bool          `env:"FEEDBACK" envDefault:"true"`
	FeedbackDedup int           `env:"FEEDBACK_DEDUP" envDefault:"250000"` // feedback event_ids remembered to count a resent verdict once
	Consumer      string        `env:"CONSUMER" envDefault:"aggregator"`
	LeaseTTL      time.Duration `env:"LEASE_TTL" envDefault:"15s"`    // how long a lease not renewed holds off another process of Consumer
	Filter        string        `env:"FILTER" envDefault:"llm.req.>"` // this aggregator's share of LLM_EVENTS
	FlushInterval time.Duration `env:"FLUSH_INTERVAL" envDefault:"1s"`
	WriteTimeout  time.Duration `env:"WRITE_TIMEOUT" envDefault:"5m"`
	MaxBuffered   int           `env:"MAX_BUFFERED" envDefault:"1000000"`
	PullBatch     int           `env:"PULL_BATCH" envDefault:"10000"`
	PublishBuffer int           `env:"PUBLISH_BUFFER" envDefault:"100000"` // rollups held until JetStream acknowledges them
	Compression   float64       `env:"COMPRESSION" envDefault:"200"`
}

func loadConfig(getenv func(string) string) (Config, error) {
	// The consumer acknowledges nothing since the floor moved to the AGGREGATOR bucket: a
	// setting that no longer acts is an error, not a silent no-op.
	for _, gone := range []string{"AGG_ACK_WAIT", "AGG_MAX_ACK_PENDING"} {
		if getenv(gone) != "" {
			return Config{}, fmt.Errorf("%s is no longer used: the aggregator keeps its replay position in the NATS key-value bucket AGGREGATOR and acknowledges nothing; remove it", gone)
		}
	}
	return envconf.Load[Config](getenv)
}

// Validate names the first bad variable.
func (c Config) Validate() error {
	if err := c.NATS.Validate(); err != nil {
		return err
	}
	if err := c.ClickHouse.Validate(); err != nil {
		return err
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	a := c.Agg
	if _, err := events.ParseBuckets(a.Buckets); err != nil {
		return fmt.Errorf("AGG_BUCKETS: %w", err)
	}
	switch {
	case c.HTTPAddr == "":
		return errors.New("HTTP_ADDR is empty")
	case a.Window < time.Second || a.Window > 24*time.Hour || a.Window%time.Second != 0:
		return fmt.Errorf("AGG_WINDOW=%s must be a whole number of seconds from 1s to 24h", a.Window)
	case a.Lateness < 0:
		return fmt.Errorf("AGG_LATENESS=%s must not be negative", a.Lateness)
	case a.MaxSeries < 1:
		return fmt.Errorf("AGG_MAX_SERIES=%d must be at least 1", a.MaxSeries)
	case !validConsumer(a.Consumer):
		return fmt.Errorf("AGG_CONSUMER=%q must be 1 to 64 of the letters a-z and A-Z, the digits, '-' and '_' (it names a NATS consumer and keys in the AGGREGATOR buckets)", a.Consumer)
	case a.LeaseTTL < time.Second || a.LeaseTTL > lease.MaxTTL:
		return fmt.Errorf("AGG_LEASE_TTL=%s must be from 1s to 10m", a.LeaseTTL)
	case a.Filter != events.SubjectRequestsAll && !strings.HasPrefix(a.Filter, "llm.req."):
		return fmt.Errorf("AGG_FILTER=%q must be llm.req.> or a narrower subject under llm.req. (such as llm.req.prod.>)", a.Filter)
	case strings.ContainsAny(a.Filter, " \t\n") || strings.Contains(a.Filter, ".."):
		return fmt.Errorf("AGG_FILTER=%q is not a valid subject", a.Filter)
	case a.FlushInterval < 10*time.Millisecond:
		return fmt.Errorf("AGG_FLUSH_INTERVAL=%s is too short (at least 10ms)", a.FlushInterval)
	case a.WriteTimeout < 100*time.Millisecond:
		return fmt.Errorf("AGG_WRITE_TIMEOUT=%s is too short (at least 100ms)", a.WriteTimeout)
	case a.MaxBuffered < 1000:
		return fmt.Errorf("AGG_MAX_BUFFERED=%d is too small (at least 1000)", a.MaxBuffered)
	case a.FeedbackDedup < 0 || a.FeedbackDedup > 100_000_000:
		return fmt.Errorf("AGG_FEEDBACK_DEDUP=%d must be 0 (off) to 100000000", a.FeedbackDedup)
	case a.PullBatch < 1:
		return fmt.Errorf("AGG_PULL_BATCH=%d must be positive", a.PullBatch)
	case a.PublishBuffer < 1:
		return fmt.Errorf("AGG_PUBLISH_BUFFER=%d must be positive", a.PublishBuffer)
	case a.Compression < 20 || a.Compression > 1000:
		return fmt.Errorf("AGG_COMPRESSION=%g must be between 20 and 1000", a.Compression)
	}
	return nil
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("AGG_LOG_LEVEL=%q must be debug, info, warn or error", s)
	}
	return l, nil
}

// validConsumer reports whether name may be an AGG_CONSUMER: a NATS consumer's name prefix,
// a key-value key and a prefix of the ClickHouse query ids of its inserts, which must not be
// a prefix of another consumer's (a '/' would make it so).
func validConsumer(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
