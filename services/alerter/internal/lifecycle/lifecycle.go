package lifecycle

import (
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Key identifies one alert: a rule at one severity on one series, host or inference
// engine (Instance the host, Engine the endpoint's name on it).
type Key struct {
	Rule, Severity            string
	Env, Scene, Model, Bucket string
	Layer                     string // empty for the gateway
	Instance                  string
	Engine                    string
}

// Labels returns the alert's labels: alertname, severity and the series' non-empty labels
// (no layer label is the gateway).
func (k Key) Labels() map[string]string {
	l := map[string]string{"alertname": k.Rule, "severity": k.Severity}
	for name, v := range map[string]string{"env": k.Env, "scene": k.Scene, "model": k.Model, "bucket": k.Bucket, "layer": k.Layer, "instance": k.Instance, "engine": k.Engine} {
		if v != "" {
			l[name] = v
		}
	}
	return l
}

// KeyOf rebuilds a Key from an alert's labels.
func KeyOf(a *events.Alert) Key {
	l := a.Labels
	return Key{Rule: a.Rule, Severity: a.Severity, Env: l["env"], Scene: l["scene"], Model: l["model"], Bucket: l["bucket"], Layer: l["layer"], Instance: l["instance"], Engine: l["engine"]}
}

// Fingerprint hashes sorted labels (FNV-1a, 64 bits, hex), as Alertmanager identifies alerts.
func Fingerprint(labels map[string]string) string {
	names := make([]string, 0, len(labels))
	for n := range labels {
		names = append(names, n)
	}
	sort.Strings(names)
	h := fnv.New64a()
	for _, n := range names {
		h.Write([]byte(n))
		h.Write([]byte{0xff})
		h.Write([]byte(labels[n]))
		h.Write([]byte{0xff})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Observation is one window's value of a rule's metric on one key, and the thresholds it
// is judged by: Threshold for an inactive or pending alert, ResolveAt (closer to normal,
// the hysteresis) for a firing one. HighIsBad gives the bad direction.
type Observation struct {
	Value     float64
	Threshold float64
	ResolveAt float64
	HighIsBad bool
	Method    string // rules.MeanSigma, rules.MedianMAD or rules.Static
	Center    float64
	Spread    float64
	Note      string // extra context for people, such as the SLA a saturated host breaks
	// Inclusive makes a value at the threshold a breach (KV-cache usage ≥ 95 %).
	Inclusive bool
	// Normal makes the observation normal whatever its value, for the reason given
	// (events.ResolvedWithinSLA): a rule whose breach needs more than its value.
	Normal string
	// Cause is the engine's side of a TTFT breach, carried into the alert.
	Cause *events.EngineCause
	// For and KeepFiringFor of the rule that produced it.
	For, KeepFiringFor int
}

func (o *Observation) breach(thr float64) bool {
	if o.Normal != "" {
		return false
	}
	if o.Inclusive && o.Value == thr {
		return true
	}
	if o.HighIsBad {
		return o.Value > thr
	}
	return o.Value < thr
}

type phase uint8

const (
	pending phase = iota + 1
	firing
)

type state struct {
	key      Key
	labels   map[string]string
	fp       string
	phase    phase
	breaches int
	normals  int
	seen     uint64
	startsAt time.Time
	lastSent time.Time
	last     Observation // the latest breaching window's
	window   time.Time
	judged   time.Time // start of the latest window observed
	keepFor  int
	// Of the normal windows counted toward resolving a firing alert: the latest one judged
	// (normal, its start; ok once there is one) and how many had no value to judge.
	normal       Observation
	normalWindow time.Time
	normalOK     bool
	silent       int
}

// Tracker holds the pending and firing alerts.
type Tracker struct {
	resend time.Duration
	states map[Key]*state
	window uint64
	start  time.Time
}

// New returns a tracker that re-sends firing alerts every resend.
func New(resend time.Duration) *Tracker {
	return &Tracker{resend: resend, states: make(map[Key]*state)}
}

// Begin starts a window: observations until End belong to it.
func (t *Tracker) Begin(windowStart time.Time) {
	t.window++
	t.start = windowStart
}

// Active reports whether key is pending or firing.
func (t *Tracker) Active(k Key) bool {
	_, ok := t.states[k]
	return ok
}

// Count returns how many alerts are firing and pending.
func (t *Tracker) Count() (firingN, pendingN int) {
	for _, s := range t.states {
		if s.phase == firing {
			firingN++
		} else {
			pendingN++
		}
	}
	return firingN, pendingN
}

// MaxHold is how long Hold keeps an alert as it is without a window judged: past it, its
// held windows count as windows without a value, so an alert on a series whose traffic
// stays too thin to judge (or a scene that sends no verdicts any more) resolves as silent
// instead of firing forever.
const MaxHold = 24 * time.Hour

// Hold marks key as seen in this window without judging it: its rule had too little
// traffic to decide, so a pending or firing alert keeps its state instead of counting a
// normal window (which would make an alert on a thin series flap), for up to MaxHold
// after its latest judged window.
func (t *Tracker) Hold(k Key) {
	if s, ok := t.states[k]; ok && t.start.Sub(s.judged) < MaxHold {
		s.seen = t.window
	}
}

// Update observes key only when it is already pending or firing: a static SLA alert raised
// while its series had too little baseline keeps being judged, and resolves, after the
// dynamic rule has taken over.
func (t *Tracker) Update(k Key, o Observation) {
	if _, ok := t.states[k]; ok {
		t.Observe(k, o)
	}
}

// Observe records the window's observation for key and reports whether it breached. A
// normal observation for a key that is neither pending nor firing costs one map lookup.
func (t *Tracker) Observe(k Key, o Observation) bool {
	s, ok := t.states[k]
	thr := o.Threshold
	if ok && s.phase == firing {
		thr = o.ResolveAt
	}
	br := o.breach(thr)
	if !ok {
		if !br {
			return false
		}
		labels := k.Labels()
		s = &state{key: k, labels: labels, fp: Fingerprint(labels), phase: pending}
		t.states[k] = s
	}
	s.seen = t.window
	s.judged = t.start
	s.keepFor = o.KeepFiringFor
	if br {
		s.breaches++
		s.normals = 0
		s.normalOK, s.silent = false, 0
		s.last = o
		s.window = t.start
		if s.phase == pending && s.breaches >= max(o.For, 1) {
			s.phase = firing
		}
		return true
	}
	s.normals++
	s.breaches = 0
	if s.phase == firing {
		// The resolved alert carries this window's value with the level it was judged
		// by; the firing alert (a re-send meanwhile) keeps the breaching window's.
		s.normal, s.normalWindow, s.normalOK = o, t.start, true
	}
	return false
}

// End closes the window at `at` (its end): keys not observed count as normal, and the
// state changes to send are returned, firing first and in fingerprint order.
func (t *Tracker) End(at time.Time) []events.Alert {
	var out []events.Alert
	for k, s := range t.states {
		if s.seen != t.window {
			s.normals++
			s.breaches = 0
			if s.phase == firing {
				s.silent++
			}
		}
		switch {
		case s.phase == pending && s.breaches == 0:
			delete(t.states, k)
		case s.phase == firing && s.normals >= max(s.keepFor, 1):
			out = append(out, s.alert(events.AlertResolved, at))
			delete(t.states, k)
		case s.phase == firing && s.breaches > 0 && s.startsAt.IsZero():
			s.startsAt = at
			s.lastSent = at
			out = append(out, s.alert(events.AlertFiring, at))
		case s.phase == firing && t.resend > 0 && at.Sub(s.lastSent) >= t.resend:
			s.lastSent = at
			out = append(out, s.alert(events.AlertFiring, at))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].State != out[j].State {
			return out[i].State == events.AlertFiring
		}
		return out[i].Fingerprint < out[j].Fingerprint
	})
	return out
}

func (s *state) alert(st string, at time.Time) events.Alert {
	labels := make(map[string]string, len(s.labels))
	for k, v := range s.labels {
		labels[k] = v
	}
	if st == events.AlertResolved {
		return s.resolved(labels, at)
	}
	return events.Alert{
		V:              1,
		Fingerprint:    s.fp,
		Rule:           s.key.Rule,
		State:          st,
		Severity:       s.key.Severity,
		Labels:         labels,
		Value:          s.last.Value,
		Threshold:      s.last.Threshold,
		BaselineMethod: s.last.Method,
		BaselineCenter: s.last.Center,
		BaselineSpread: s.last.Spread,
		WindowStart:    s.window.UTC(),
		StartsAt:       s.startsAt.UTC(),
		At:             at.UTC(),
		Summary:        s.summary(),
		// What a restart needs to keep the hold.
		JudgedWindowStart: s.judged.UTC(),
		EngineCause:       s.last.Cause,
	}
}

// resolved returns the resolved alert. Its numbers are those of one window, the latest
// judged normal, and the level that window was judged by (the resolve level), so a
// subscriber never reads "resolved" next to a value beyond the threshold it is shown with.
// Without such a window (the series went silent) they are the last breaching window's,
// and the reason says so.
func (s *state) resolved(labels map[string]string, at time.Time) events.Alert {
	o, window := &s.last, s.window
	thr := o.Threshold
	if s.normalOK {
		o, window = &s.normal, s.normalWindow
		thr = o.ResolveAt
		if o.Normal != "" {
			thr = o.Threshold
		}
	}
	reason := events.ResolvedNormal
	switch {
	case s.silent > 0:
		reason = events.ResolvedSilent
	case o.Normal != "":
		reason = o.Normal
	}
	a := events.Alert{
		V:              1,
		Fingerprint:    s.fp,
		Rule:           s.key.Rule,
		State:          events.AlertResolved,
		Severity:       s.key.Severity,
		Labels:         labels,
		Value:          o.Value,
		Threshold:      thr,
		BaselineMethod: o.Method,
		BaselineCenter: o.Center,
		BaselineSpread: o.Spread,
		WindowStart:    window.UTC(),
		StartsAt:       s.startsAt.UTC(),
		EndsAt:         at.UTC(),
		At:             at.UTC(),
		ResolveReason:  reason,
	}
	a.Summary = s.resolvedSummary(o, thr, reason)
	return a
}

// summary is a firing alert's line.
func (s *state) summary() string {
	o := &s.last
	var b strings.Builder
	fmt.Fprintf(&b, "%s firing: %.4g", s.key.Rule, o.Value)
	s.direction(&b, o)
	fmt.Fprintf(&b, "%.4g", o.Threshold)
	s.summaryTail(&b, o)
	return b.String()
}

func (s *state) resolvedSummary(o *Observation, thr float64, reason string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s resolved: ", s.key.Rule)
	switch {
	case reason == events.ResolvedSilent && !s.normalOK:
		fmt.Fprintf(&b, "no value to judge for %d window(s); last %.4g", s.silent, o.Value)
		s.direction(&b, o)
		fmt.Fprintf(&b, "%.4g", thr)
	case o.Normal == events.ResolvedWithinSLA: // busy: the value is beyond the level, and normal
		fmt.Fprintf(&b, "%.4g, but no series it serves breaks its TTFT p95 SLA", o.Value)
	default:
		fmt.Fprintf(&b, "%.4g back", o.Value)
		switch { // the side of the level a normal value is on
		case o.Inclusive && o.HighIsBad:
			b.WriteString(" below ")
		case o.HighIsBad:
			b.WriteString(" at or below ")
		case o.Inclusive:
			b.WriteString(" above ")
		default:
			b.WriteString(" at or above ")
		}
		fmt.Fprintf(&b, "%.4g", thr)
	}
	if o.Normal != events.ResolvedWithinSLA {
		o = &Observation{Method: o.Method, Center: o.Center, Spread: o.Spread} // no note: it explained the breach
	}
	s.summaryTail(&b, o)
	if reason == events.ResolvedSilent && s.normalOK { // before or after the normal one
		fmt.Fprintf(&b, "; %d window(s) had no value to judge", s.silent)
	}
	return b.String()
}

func (s *state) direction(b *strings.Builder, o *Observation) {
	switch {
	case o.Inclusive && o.HighIsBad:
		b.WriteString(" at or above ")
	case o.HighIsBad:
		b.WriteString(" above ")
	case o.Inclusive:
		b.WriteString(" at or below ")
	default:
		b.WriteString(" below ")
	}
}

// summaryTail writes the baseline, where and the note.
func (s *state) summaryTail(b *strings.Builder, o *Observation) {
	switch o.Method {
	case "mean_sigma":
		fmt.Fprintf(b, " (baseline mean %.4g, σ %.4g)", o.Center, o.Spread)
	case "median_mad":
		fmt.Fprintf(b, " (baseline median %.4g, MAD %.4g)", o.Center, o.Spread)
	}
	var where []string
	for _, v := range []string{s.key.Env, s.key.Scene, s.key.Model, s.key.Bucket, s.key.Layer, s.key.Instance, s.key.Engine} {
		if v != "" {
			where = append(where, v)
		}
	}
	if len(where) > 0 {
		b.WriteString(" on ")
		b.WriteString(strings.Join(where, "/"))
	}
	if o.Note != "" {
		b.WriteString("; ")
		b.WriteString(o.Note)
	}
}

// Restore makes a firing alert read back after a restart firing again without sending it:
// it will be re-sent at its resend time and resolved once, after keepFiringFor normal
// windows (its rule's, as before the restart), or once held for MaxHold after its latest
// judged window (JudgedWindowStart). A resolved alert clears its key. highIsBad and
// inclusive are its rule's bad direction and whether a value at the threshold breaches
// (Observation's), which the alert does not carry.
func (t *Tracker) Restore(a events.Alert, keepFiringFor int, highIsBad, inclusive bool) {
	k := KeyOf(&a)
	if a.State != events.AlertFiring {
		delete(t.states, k)
		return
	}
	labels := k.Labels()
	if a.StartsAt.IsZero() {
		a.StartsAt = a.At
	}
	judged := a.WindowStart // an alert from before judged_window_start: its breach
	if a.JudgedWindowStart.After(judged) {
		judged = a.JudgedWindowStart
	}
	if judged.IsZero() {
		judged = a.At
	}
	t.states[k] = &state{
		key:      k,
		labels:   labels,
		fp:       Fingerprint(labels),
		phase:    firing,
		breaches: 1,
		seen:     t.window,
		startsAt: a.StartsAt,
		lastSent: a.At,
		window:   a.WindowStart,
		judged:   judged,
		keepFor:  keepFiringFor,
		last: Observation{
			Value: a.Value, Threshold: a.Threshold, HighIsBad: highIsBad, Inclusive: inclusive, Method: a.BaselineMethod,
			Center: a.BaselineCenter, Spread: a.BaselineSpread,
		},
	}
}
