// Package envconf fills a service's configuration struct from the environment with
// caarlos0/env, and names the variable a bad value came from: caarlos0/env's own parse
// errors name the Go field, which is not what a person sets.
package envconf

import (
	"errors"
	"fmt"
	"slices"

	"github.com/caarlos0/env/v11"
)

// Parse fills a T (a struct with env, envDefault and envPrefix tags) from getenv. It reads
// only the variables T declares, so it works with os.Getenv and with a test's map alike.
func Parse[T any](getenv func(string) string) (T, error) {
	var cfg T
	params, err := env.GetFieldParams(&cfg)
	if err != nil {
		return cfg, fmt.Errorf("cannot list the configuration variables: %w", err)
	}
	vars := make(map[string]string, len(params))
	for _, p := range params {
		if v := getenv(p.Key); v != "" {
			vars[p.Key] = v
		}
	}
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: vars}); err != nil {
		return cfg, nameBadVariable[T](vars, err)
	}
	return cfg, nil
}

// nameBadVariable parses each variable alone to find the one that fails.
func nameBadVariable[T any](vars map[string]string, err error) error {
	keys := make([]string, 0, len(vars))
	for k := range vars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var one T
		if kerr := env.ParseWithOptions(&one, env.Options{Environment: map[string]string{k: vars[k]}}); kerr != nil {
			var pe env.ParseError
			if errors.As(kerr, &pe) {
				kerr = pe.Err
			}
			return fmt.Errorf("%s=%q cannot be parsed: %w", k, vars[k], kerr)
		}
	}
	return fmt.Errorf("cannot parse the configuration: %w", err)
}

// Validator is a configuration that checks itself, naming the bad variable.
type Validator interface{ Validate() error }

// Load is Parse followed by the configuration's own Validate.
func Load[T Validator](getenv func(string) string) (T, error) {
	cfg, err := Parse[T](getenv)
	if err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}
