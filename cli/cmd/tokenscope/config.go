package main

import (
	"fmt"

	"github.com/caarlos0/env/v11"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// Config is what the command reads from the environment: the ClickHouse that report
// reads, named as the services name it.
type Config struct {
	ClickHouse chdb.Config `envPrefix:"CLICKHOUSE_"`
}

func loadConfig(getenv func(string) string) (Config, error) {
	var cfg Config
	params, err := env.GetFieldParams(&cfg)
	if err != nil {
		return cfg, fmt.Errorf("cannot list the configuration variables: %w", err)
	}
	vars := map[string]string{}
	for _, p := range params {
		if v := getenv(p.Key); v != "" {
			vars[p.Key] = v
		}
	}
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: vars}); err != nil {
		for _, p := range params {
			if v, ok := vars[p.Key]; ok {
				var one Config
				if perr := env.ParseWithOptions(&one, env.Options{Environment: map[string]string{p.Key: v}}); perr != nil {
					return cfg, fmt.Errorf("%s=%q is not valid: %w", p.Key, v, perr)
				}
			}
		}
		return cfg, fmt.Errorf("cannot parse the configuration: %w", err)
	}
	return cfg, cfg.Validate()
}

// Validate names the first bad variable.
func (c Config) Validate() error { return c.ClickHouse.Validate() }
