package engine

import (
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/alerter/internal/baseline"
	"github.com/tokenscope/tokenscope/services/alerter/internal/lifecycle"
	"github.com/tokenscope/tokenscope/services/alerter/internal/rules"
)

// SceneKey identifies a business series: satisfaction and completion rate are judged per
// env × scene, over every model, input bucket and instance.
type SceneKey struct{ Env, Scene string }

// bizAgg sums one scene's verdicts and outcomes of a window.
type bizAgg struct {
	hist                 *baseline.History
	verdicts, positive   uint64 // SatisfactionFeedback verdicts
	completed, abandoned uint64 // gateway requests' outcomes and CompletionFeedback verdicts
}

func (a *bizAgg) empty() bool { return a.verdicts == 0 && a.completed+a.abandoned == 0 }

func (a *bizAgg) reset() {
	h := a.hist
	*a = bizAgg{hist: h}
}

func (e *Engine) scene(k SceneKey) *bizAgg {
	a := e.bizAgg[k]
	if a == nil {
		a = &bizAgg{}
		e.bizAgg[k] = a
	}
	return a
}

// groupBusiness sums the window's outcomes (gateway token rollups: the same requests seen at
// another layer would count twice), completion verdicts (CompletionFeedback: positive
// completed, the rest abandoned) and satisfaction verdicts per env × scene. Verdicts that
// carry no scene belong to no scene's series. An app reports a task's completion one way:
// one that sends both an outcome and a completion verdict counts twice here.
func (e *Engine) groupBusiness(w Window) {
	for i := range w.Tokens {
		r := &w.Tokens[i]
		if r.Kind != events.KindWindow || SeriesLayer(r.Layer) != "" || r.Completed+r.Abandoned == 0 {
			continue
		}
		a := e.scene(SceneKey{Env: r.Env, Scene: r.Scene})
		a.completed += r.Completed
		a.abandoned += r.Abandoned
	}
	for i := range w.Feedback {
		f := &w.Feedback[i]
		if f.Kind != events.KindWindow {
			e.counts.SkippedRows++
			continue
		}
		if f.Scene == "" || f.Count == 0 {
			continue
		}
		switch f.Name {
		case rules.SatisfactionFeedback:
			a := e.scene(SceneKey{Env: f.Env, Scene: f.Scene})
			a.verdicts += f.Count
			a.positive += min(f.Positive, f.Count)
		case rules.CompletionFeedback:
			a := e.scene(SceneKey{Env: f.Env, Scene: f.Scene})
			done := min(f.Positive, f.Count)
			a.completed += done
			a.abandoned += f.Count - done
		}
	}
}

var businessMetrics = [rules.NumBusinessMetrics]rules.Metric{rules.Satisfaction, rules.CompletionRate}

// processBusiness judges and learns each scene's satisfaction and completion rate. A metric
// without verdicts or outcomes in the window holds its alerts, as one under the minimum
// count does: verdicts are sparse, and a window without any says nothing either way.
func (e *Engine) processBusiness(plan baseline.Plan, evaluate, learn bool) {
	for key, a := range e.bizAgg {
		r := e.rules.For(key.Scene)
		lk := lifecycle.Key{Env: key.Env, Scene: key.Scene}
		var vals [rules.NumBusinessMetrics]float64
		var ok, learnOK [rules.NumBusinessMetrics]bool
		var counts [rules.NumBusinessMetrics]uint64
		if a.verdicts > 0 {
			vals[0], ok[0], counts[0] = float64(a.positive)/float64(a.verdicts), true, a.verdicts
		}
		if n := a.completed + a.abandoned; n > 0 {
			vals[1], ok[1], counts[1] = float64(a.completed)/float64(n), true, n
		}
		active := false
		for i, m := range businessMetrics {
			if !ok[i] {
				lk.Rule, lk.Severity = rules.DynamicName(m), r.Dynamic[m].Severity
				if e.life.Active(lk) {
					active = true
					if evaluate {
						e.life.Hold(lk)
					}
				}
			}
		}
		if a.empty() {
			if !active { // nothing to hold: the scene leaves the scratch map until it has data
				delete(e.bizAgg, key)
			}
			continue
		}
		if a.hist == nil {
			a.hist = e.biz.Series(key)
		}
		if evaluate {
			e.counts.Scenes++
			for i, m := range businessMetrics {
				if ok[i] {
					e.checkDynamic(r, m, lk, a.hist, plan, vals[i], counts[i], nil)
				}
			}
		}
		if learn {
			for i, m := range businessMetrics {
				learnOK[i] = ok[i] && counts[i] >= r.Dynamic[m].MinRequests
			}
			e.biz.AddAll(a.hist, plan.Step, vals[:], learnOK[:])
		}
		a.reset()
	}
}

// MergeBusiness is MergeSeries for a scene's business metrics.
func (e *Engine) MergeBusiness(key SceneKey, t time.Time, m rules.Metric, n uint64, mean, variance float64, sample []float64) {
	e.biz.Merge(e.biz.Series(key), e.biz.StepOf(t), int(m)-int(rules.Satisfaction), n, mean, variance, sample)
}
