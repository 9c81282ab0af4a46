package envconf_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/envconf"
)

type inner struct {
	Timeout time.Duration `env:"TIMEOUT" envDefault:"5s"`
}

type config struct {
	Name  string `env:"NAME" envDefault:"x"`
	Count int    `env:"COUNT" envDefault:"3"`
	Inner inner  `envPrefix:"IN_"`
}

func TestParse(t *testing.T) {
	f := func(vars map[string]string, want string) {
		t.Helper()
		cfg, err := envconf.Parse[config](func(k string) string { return vars[k] })
		switch {
		case want == "" && err != nil:
			t.Fatalf("%v: %v", vars, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("%v: error %v, want one naming %s", vars, err, want)
		case want == "" && vars["COUNT"] == "" && (cfg.Count != 3 || cfg.Inner.Timeout != 5*time.Second):
			t.Fatalf("defaults not applied: %+v", cfg)
		}
	}
	f(nil, "")
	f(map[string]string{"COUNT": "7", "IN_TIMEOUT": "1m"}, "")
	f(map[string]string{"COUNT": "seven"}, `COUNT="seven"`)
	f(map[string]string{"IN_TIMEOUT": "soon", "NAME": "ok"}, `IN_TIMEOUT="soon"`)
	f(map[string]string{"UNRELATED": "x"}, "")
}

type checked struct {
	Count int `env:"COUNT" envDefault:"3"`
}

func (c checked) Validate() error {
	if c.Count < 1 {
		return errors.New("COUNT must be at least 1")
	}
	return nil
}

func TestLoadValidates(t *testing.T) {
	if _, err := envconf.Load[checked](func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	_, err := envconf.Load[checked](func(k string) string { return map[string]string{"COUNT": "0"}[k] })
	if err == nil || !strings.Contains(err.Error(), "COUNT") {
		t.Fatalf("got %v", err)
	}
}
