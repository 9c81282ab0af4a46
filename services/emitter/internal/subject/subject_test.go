package subject_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/services/emitter/internal/subject"
)

var t0 = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

// TestBurstThenRealScene: 100,000 made-up scenes make at most the limit's subjects (and the
// env keeps its own), and once they stop coming a real new scene gets its own subject.
func TestBurstThenRealScene(t *testing.T) {
	const limit = 1000
	reg := prometheus.NewRegistry()
	l := subject.New(limit, time.Hour, reg)
	subjects := map[string]bool{}
	if s := l.Request("prod", "support", t0); s != "llm.req.prod.support" {
		t.Fatalf("first subject %q", s)
	}
	for i := range 100_000 {
		subjects[l.Request("prod", fmt.Sprint("burst-", i), t0.Add(time.Duration(i)*time.Millisecond))] = true
	}
	if len(subjects) != limit { // limit-1 burst scenes and llm.req.prod.other
		t.Fatalf("%d subjects from the burst, want %d", len(subjects), limit)
	}
	if !subjects["llm.req.prod.other"] {
		t.Fatal("the burst past the limit is not on llm.req.prod.other")
	}
	burstEnd := t0.Add(100 * time.Second)
	// While the burst is recent: a known subject keeps its own, a new one folds, a new env keeps its env.
	for _, c := range []struct{ env, scene, want string }{
		{"prod", "support", "llm.req.prod.support"},
		{"prod", "checkout", "llm.req.prod.other"},
		{"staging", "checkout", "llm.req.staging.other"},
	} {
		if got := l.Request(c.env, c.scene, burstEnd.Add(time.Minute)); got != c.want {
			t.Fatalf("%s/%s during the burst: %q, want %q", c.env, c.scene, got, c.want)
		}
	}
	// An hour after the burst went quiet, a real new scene has its subject back.
	if got := l.Request("prod", "checkout", burstEnd.Add(time.Hour+time.Second)); got != "llm.req.prod.checkout" {
		t.Fatalf("a new scene after the burst went quiet: %q", got)
	}
	if got := folded(t, reg); got != 100_000-(limit-1)+2 {
		t.Fatalf("folded %v", got)
	}
}

// TestEnvAloneOverflows: envs past MaxEnvs fold into llm.req.other.other, and only then.
func TestEnvAloneOverflows(t *testing.T) {
	l := subject.New(1, time.Hour, nil)
	if s := l.Request("prod", "a", t0); s != "llm.req.prod.a" {
		t.Fatal(s)
	}
	for i := range subject.MaxEnvs {
		if s, want := l.Request(fmt.Sprint("env", i), "a", t0), fmt.Sprintf("llm.req.env%d.other", i); s != want {
			t.Fatalf("%q, want %q", s, want)
		}
	}
	if s := l.Request("one-too-many", "a", t0); s != subject.Folded {
		t.Fatalf("%q, want %q", s, subject.Folded)
	}
	if s := l.Request("env0", "b", t0); s != "llm.req.env0.other" {
		t.Fatalf("a known env lost its own folded subject: %q", s)
	}
}

func folded(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "emitter_subjects_folded_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// BenchmarkRequest is the cost per event of a subject already in use, the steady state.
func BenchmarkRequest(b *testing.B) {
	l := subject.New(1000, time.Hour, nil)
	scenes := make([]string, 100)
	for i := range scenes {
		scenes[i] = fmt.Sprint("scene-", i)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		l.Request("prod", scenes[i%len(scenes)], t0)
		i++
	}
}
