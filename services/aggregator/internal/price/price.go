// Package price turns token counts into US dollars from a price table that maps model-name
// patterns to prices per million input, output and cached-input tokens.
package price

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strings"
)

// Price is what one model costs, in USD per million tokens. Cached input tokens are part of
// the input tokens and are charged CachedInput instead of Input.
type Price struct {
	Model       string  `json:"model"` // a pattern: * matches any run of characters
	Input       float64 `json:"input"`
	Output      float64 `json:"output"`
	CachedInput float64 `json:"cached_input"`
}

// Table finds a model's price: the first entry whose pattern matches. Lookups are cached
// per model name, up to a bound. A Table is not safe for concurrent use.
type Table struct {
	prices []Price
	cache  map[string]int // model → index in prices, or -1 when unpriced
}

const maxCached = 10_000

// Load reads a price table from a JSON file: an array of {"model", "input", "output",
// "cached_input"}. An empty path gives an empty table: every model is unpriced.
func Load(file string) (*Table, error) {
	if file == "" {
		return New(nil)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("cannot read AGG_PRICES file: %w", err)
	}
	var prices []Price
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&prices); err != nil {
		return nil, fmt.Errorf("cannot parse AGG_PRICES file %s: %w", file, err)
	}
	t, err := New(prices)
	if err != nil {
		return nil, fmt.Errorf("AGG_PRICES file %s: %w", file, err)
	}
	return t, nil
}

// New checks the prices and returns a table.
func New(prices []Price) (*Table, error) {
	for i, p := range prices {
		if p.Model == "" {
			return nil, fmt.Errorf("entry %d has no model pattern", i+1)
		}
		if _, err := path.Match(p.Model, ""); err != nil {
			return nil, fmt.Errorf("entry %d: bad model pattern %q: %w", i+1, p.Model, err)
		}
		if p.Input < 0 || p.Output < 0 || p.CachedInput < 0 {
			return nil, fmt.Errorf("entry %d (%s): prices must not be negative", i+1, p.Model)
		}
	}
	return &Table{prices: prices, cache: map[string]int{}}, nil
}

// Cost returns the cost of one request in USD, and false when the model has no price.
func (t *Table) Cost(model string, input, cached, output int64) (float64, bool) {
	i, ok := t.cache[model]
	if !ok {
		i = -1
		for j, p := range t.prices {
			// path.Match treats '/' specially; model names such as "meta-llama/Llama-3"
			// must match across it, so compare with '/' mapped away on both sides.
			if m, _ := path.Match(noSlash(p.Model), noSlash(model)); m {
				i = j
				break
			}
		}
		if len(t.cache) < maxCached {
			t.cache[strings.Clone(model)] = i
		}
	}
	if i < 0 {
		return 0, false
	}
	p := t.prices[i]
	uncached := max(input-cached, 0)
	return (float64(uncached)*p.Input + float64(cached)*p.CachedInput + float64(output)*p.Output) / 1e6, true
}

func noSlash(s string) string { return strings.ReplaceAll(s, "/", "\x00") }
