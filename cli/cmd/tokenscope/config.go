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
	return envconf.Load[Config](getenv)
}

// Validate names the first bad variable.
func (c Config) Validate() error { return c.ClickHouse.Validate() }
