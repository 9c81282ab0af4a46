package scrape

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// FuzzExposition reads two arbitrary expositions one tick apart, as each engine kind: it
// must never panic, and every sample it makes must pass the contract (hostile values are
// left out before a sample is made, never published as an invalid one).
func FuzzExposition(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.prom")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, b)
	}
	f.Add([]byte(small(10, 1, 2, 1)), []byte(small(5, 2, 2, 3)))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		for _, kind := range []string{events.EngineVLLM, events.EngineSGLang, events.EngineTGI} {
			s, _ := newScraper(t, []Target{{Engine: kind, Name: kind, URL: "http://127.0.0.1:1/"}}, nil, 8)
			tg := s.targets[0]
			for i, body := range [][]byte{a, b} {
				now := t0.Add(time.Duration(i) * time.Second)
				p := expfmt.NewTextParser(model.UTF8Validation)
				fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
				if err != nil {
					continue
				}
				cur := s.read(tg, fams)
				if len(cur) > 8 {
					t.Fatalf("%d models over the limit of 8", len(cur))
				}
				for mdl, st := range cur {
					st.ts = now
					smp := events.EngineSample{V: events.Version, TS: now, Host: "h", Engine: kind, Name: kind, Model: mdl, Up: true}
					s.fill(tg, &smp, st, tg.models[mdl])
					if err := smp.ValidateAt(now); err != nil && events.Reason(err) != "too_long" && events.Reason(err) != "not_utf8" {
						t.Fatalf("%s: sample breaks the contract: %v\n%s", kind, err, jsonOf(smp))
					}
				}
				tg.models = cur
			}
		}
	})
}
