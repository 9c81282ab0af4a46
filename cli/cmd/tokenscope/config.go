package main

import (
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/envconf"
)

// Config is what the command reads from the environment: the ClickHouse that report
// reads, named as the services name it.
type Config struct {
	ClickHouse chdb.Config `envPrefix:"CLICKHOUSE_"`
}

func loadConfig(getenv func(string) string) (Config, error) {
	cfg, err := envconf.Parse[Config](getenv)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Validate names the first bad variable.
func (c Config) Validate() error { return c.ClickHouse.Validate() }
