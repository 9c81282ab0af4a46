package price_test

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokenscope/tokenscope/services/aggregator/internal/price"
)

func TestCost(t *testing.T) {
	tab, err := price.New([]price.Price{
		{Model: "gpt-4o-mini*", Input: 0.15, Output: 0.6, CachedInput: 0.075},
		{Model: "gpt-4o*", Input: 2.5, Output: 10, CachedInput: 1.25},
		{Model: "meta-llama/*", Input: 0.2, Output: 0.2},
	})
	if err != nil {
		t.Fatal(err)
	}
	f := func(model string, in, cached, out int64, want float64, wantOK bool) {
		t.Helper()
		got, ok := tab.Cost(model, in, cached, out)
		if ok != wantOK || math.Abs(got-want) > 1e-12 {
			t.Fatalf("Cost(%s, %d, %d, %d) = %v, %v; want %v, %v", model, in, cached, out, got, ok, want, wantOK)
		}
	}
	f("gpt-4o-2024-08-06", 1_000_000, 0, 0, 2.5, true)
	f("gpt-4o-mini", 1_000_000, 500_000, 1_000_000, 0.075+0.0375+0.6, true)
	f("meta-llama/Llama-3.1-70B", 1000, 0, 1000, 0.0004, true)
	f("claude-x", 1000, 0, 1000, 0, false)
	f("claude-x", 1000, 0, 1000, 0, false) // cached miss
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "p.json")
	os.WriteFile(good, []byte(`[{"model":"qwen*","input":0.5,"output":1.5}]`), 0o644)
	if _, err := price.Load(good); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"unknown field": `[{"model":"x","inptu":1}]`,
		"negative":      `[{"model":"x","input":-1}]`,
		"bad pattern":   `[{"model":"[x","input":1}]`,
		"not json":      `model: x`,
	} {
		p := filepath.Join(dir, "bad.json")
		os.WriteFile(p, []byte(body), 0o644)
		if _, err := price.Load(p); err == nil || !strings.Contains(err.Error(), "AGG_PRICES") {
			t.Fatalf("%s: got %v", name, err)
		}
	}
	if tab, err := price.Load(""); err != nil {
		t.Fatal(err)
	} else if _, ok := tab.Cost("any", 1, 0, 1); ok {
		t.Fatal("an empty table priced a model")
	}
}
