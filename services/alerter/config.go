package main

import (
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/envconf"
	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
)

// Config is the alerter's configuration, from the environment.
type Config struct {
	HTTPAddr   string      `env:"HTTP_ADDR" envDefault:"127.0.0.1:9104"`
	NATS       bus.Config  `envPrefix:"NATS_"`
	ClickHouse chdb.Config `envPrefix:"CLICKHOUSE_"`

	// Rules is a YAML rules file overriding the built-in rules; empty keeps them.
	Rules string `env:"ALERTER_RULES"`
	// Slot: the baseline is the same time of day ± Slot on each previous day.
	Slot time.Duration `env:"ALERTER_SLOT" envDefault:"30m"`
	// BaselineDays of history, loaded from ClickHouse at start.
	BaselineDays int `env:"ALERTER_BASELINE_DAYS" envDefault:"7"`
	// BaselineStep is the resolution the history is kept at.
	BaselineStep time.Duration `env:"ALERTER_BASELINE_STEP" envDefault:"5m"`
	// Timezone in which time of day and weekends are read.
	Timezone string `env:"ALERTER_TIMEZONE" envDefault:"UTC"`
	// SplitWeekends compares weekdays with weekdays and weekends with weekends.
	SplitWeekends bool `env:"ALERTER_SPLIT_WEEKENDS" envDefault:"true"`
	// Resend: a firing alert is sent again this often.
	Resend time.Duration `env:"ALERTER_RESEND" envDefault:"1h"`
	// Settle: a window is evaluated once no rollup of it arrived for this long.
	Settle time.Duration `env:"ALERTER_SETTLE" envDefault:"5s"`
	// WatermarkTimeout bounds how long past Settle a window waits for an aggregator whose
	// watermark has not passed it; 0 waits for none.
	WatermarkTimeout time.Duration `env:"ALERTER_WATERMARK_TIMEOUT" envDefault:"1m"`
	// Consumer is the durable consumer's name on ROLLUPS.
	Consumer string `env:"ALERTER_CONSUMER" envDefault:"alerter"`
	// RowsConsumer is the durable consumer's name on ALERTS that writes the alerts table.
	RowsConsumer string `env:"ALERTER_ROWS_CONSUMER" envDefault:"alerter-rows"`
	// MaxSeries bounds the series of each kind (token series, hosts, engines, scenes) whose
	// baseline history is kept.
	MaxSeries int `env:"ALERTER_MAX_SERIES" envDefault:"100000"`
	// MaxAckPending bounds the rollups held unacknowledged while their window settles.
	MaxAckPending int `env:"ALERTER_MAX_ACK_PENDING" envDefault:"100000"`
	// RestoreLookback: how far back the ALERTS stream is read at start to restore firing alerts.
	RestoreLookback time.Duration `env:"ALERTER_RESTORE_LOOKBACK" envDefault:"168h"`
	// AlertmanagerURL, such as http://127.0.0.1:9093, also receives the alerts.
	AlertmanagerURL     string        `env:"ALERTER_ALERTMANAGER_URL"`
	AlertmanagerTimeout time.Duration `env:"ALERTER_ALERTMANAGER_TIMEOUT" envDefault:"10s"`
	LogLevel            string        `env:"ALERTER_LOG_LEVEL" envDefault:"info"`
}

// parseConfig reads the configuration through getenv and validates it.
func parseConfig(getenv func(string) string) (Config, error) {
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
	if _, err := c.BaselineOptions(); err != nil {
		return err
	}
	var lvl slog.Level
	switch {
	case c.HTTPAddr == "":
		return fmt.Errorf("HTTP_ADDR is empty")
	case c.Resend < time.Minute:
		return fmt.Errorf("ALERTER_RESEND=%s must be at least 1m", c.Resend)
	case c.Settle < 0 || c.Settle > 10*time.Minute:
		return fmt.Errorf("ALERTER_SETTLE=%s must be from 0 to 10m", c.Settle)
	case c.WatermarkTimeout < 0 || c.WatermarkTimeout > 30*time.Minute:
		return fmt.Errorf("ALERTER_WATERMARK_TIMEOUT=%s must be from 0 to 30m", c.WatermarkTimeout)
	case c.Consumer == "" || !validName(c.Consumer):
		return fmt.Errorf("ALERTER_CONSUMER=%q must be letters, digits, - and _", c.Consumer)
	case c.RowsConsumer == "" || !validName(c.RowsConsumer):
		return fmt.Errorf("ALERTER_ROWS_CONSUMER=%q must be letters, digits, - and _", c.RowsConsumer)
	case c.MaxAckPending < 1000:
		return fmt.Errorf("ALERTER_MAX_ACK_PENDING=%d must be at least 1000", c.MaxAckPending)
	case c.RestoreLookback < c.Resend:
		return fmt.Errorf("ALERTER_RESTORE_LOOKBACK=%s must be at least ALERTER_RESEND=%s", c.RestoreLookback, c.Resend)
	case c.AlertmanagerTimeout <= 0:
		return fmt.Errorf("ALERTER_ALERTMANAGER_TIMEOUT=%s must be positive", c.AlertmanagerTimeout)
	case lvl.UnmarshalText([]byte(c.LogLevel)) != nil:
		return fmt.Errorf("ALERTER_LOG_LEVEL=%q must be debug, info, warn or error", c.LogLevel)
	}
	if c.AlertmanagerURL != "" {
		u, err := url.Parse(c.AlertmanagerURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("ALERTER_ALERTMANAGER_URL=%q is not a URL such as http://127.0.0.1:9093", ops.RedactURL(c.AlertmanagerURL))
		}
	}
	return nil
}

// BaselineOptions returns the baseline's options, or an error naming the bad variable.
func (c Config) BaselineOptions() (baseline.Options, error) {
	loc, err := time.LoadLocation(c.Timezone)
	if err != nil {
		return baseline.Options{}, fmt.Errorf("ALERTER_TIMEZONE=%q is not a time zone such as UTC or Europe/Paris", c.Timezone)
	}
	o := baseline.Options{Step: c.BaselineStep, Slot: c.Slot, Days: c.BaselineDays, Location: loc, SplitWeekends: c.SplitWeekends, MaxSeries: c.MaxSeries}
	return o, o.Validate()
}

func validName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
