package notify

import (
	"bytes"
	"container/list"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
)

// amAlert is one alert in Alertmanager's /api/v2/alerts format (postableAlert).
type amAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt,omitzero"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

// Alertmanager posts alerts to an Alertmanager from its own goroutine, so a slow or absent
// Alertmanager never holds up evaluation.
//
// What waits to be posted is each alert's latest state, one per fingerprint: a state
// change replaces the one of the same alert not yet posted (Alertmanager's API takes the
// current state of alerts, as Prometheus re-sends it). So a retried post never lands an
// alert's stale state after its newer one was dropped: a post that fails is retried with
// what is queued then. The queue is bounded by distinct alerts (maxQueuedAlerts); past it
// the alert whose state changed least recently, and is not in the post in flight, is
// dropped and counted.
type Alertmanager struct {
	url     string
	shown   string   // url redacted (ops.RedactURL), for errors and logs
	secrets []string // the URL's user information and query values, hidden in answers shown
	client  *http.Client
	resend  time.Duration
	logger  *slog.Logger
	posted  prometheus.Counter
	failed  prometheus.Counter
	dropped prometheus.Counter

	mu     sync.Mutex
	order  *list.List               // of *queued, the least recently changed first
	queued map[string]*list.Element // by fingerprint
	ver    uint64                   // numbers each state change queued
	wake   chan struct{}            // signalled (without blocking) when alerts are queued
}

// queued is an alert's latest state waiting to be posted.
type queued struct {
	alert   events.Alert
	ver     uint64 // the state change it is; a newer one queued while it was posted keeps it
	sending bool   // in the post in flight: never the one dropped
}

// maxQueuedAlerts bounds the alerts waiting for Alertmanager, as Prometheus's notifier
// queue (--alertmanager.notification-queue-capacity, 10000) does.
const maxQueuedAlerts = 10000

// NewAlertmanager returns a client for the Alertmanager at base (such as
// http://127.0.0.1:9093). Firing alerts carry endsAt = at + 4 × resend, as Prometheus
// does, so Alertmanager resolves them by itself if the alerter goes away.
func NewAlertmanager(base string, timeout, resend time.Duration, reg prometheus.Registerer, logger *slog.Logger) *Alertmanager {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "alerter", Name: name, Help: help})
	}
	u := alertsURL(base)
	a := &Alertmanager{
		url:   u,
		shown: ops.RedactURL(u),
		client: &http.Client{
			Timeout: timeout,
			// Alertmanager's API never redirects; a proxy in front of it may (to a login
			// page), and following that turned the POST into a GET whose answer counted as
			// posted, or sent the alerts to another host. A redirect is a failed post.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		resend:  resend,
		logger:  logger.With("component", "alertmanager"),
		posted:  c("alertmanager_alerts_posted_total", "Alerts Alertmanager accepted."),
		failed:  c("alertmanager_post_errors_total", "Posts to Alertmanager that failed (and were retried)."),
		dropped: c("alertmanager_alerts_dropped_total", "Alerts dropped because Alertmanager was away too long."),
		order:   list.New(),
		queued:  make(map[string]*list.Element),
		wake:    make(chan struct{}, 1),
	}
	a.secrets = urlSecrets(u)
	reg.MustRegister(a.posted, a.failed, a.dropped)
	return a
}

// alertsURL returns the /api/v2/alerts URL of the Alertmanager at base, keeping base's
// query (a token a proxy before it wants): appended after the query, the path became part
// of a query value, and the alerts went to base's own path.
func alertsURL(base string) string {
	u, err := url.Parse(base)
	if err != nil {
		return strings.TrimRight(base, "/") + "/api/v2/alerts" // refused by Validate; shown redacted
	}
	u.Path = strings.TrimRight(u.Path, "/") + "/api/v2/alerts"
	u.RawPath = ""
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}

// urlSecrets returns what of raw may be a secret, as it may be echoed in an answer: the
// user name and password (and their basic-auth encoding) and every query value, escaped
// and not.
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	add := func(v string) {
		if len(v) >= 4 {
			out = append(out, v, url.QueryEscape(v), url.PathEscape(v))
		}
	}
	if u.User != nil {
		add(u.User.Username())
		if p, ok := u.User.Password(); ok {
			add(p)
			out = append(out, base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+p)))
		}
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			add(v)
		}
	}
	// Longest first, so that a secret holding another is hidden whole.
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// scrub hides the URL's secrets in an answer Alertmanager, or a proxy before it, gave:
// one that echoes the request ("Cannot POST /api/v2/alerts?token=…") would show them.
func (a *Alertmanager) scrub(out string) string {
	for _, s := range a.secrets {
		out = strings.ReplaceAll(out, s, "xxxxx")
	}
	return out
}

// Enqueue queues alerts for posting; it never blocks. An alert already queued has its
// state replaced by the newer one; past maxQueuedAlerts distinct alerts the least recently
// changed one not being posted is dropped. One goroutine enqueues, in the order of the
// state changes.
func (a *Alertmanager) Enqueue(alerts []events.Alert) {
	a.mu.Lock()
	for i := range alerts {
		a.ver++
		if e, ok := a.queued[alerts[i].Fingerprint]; ok {
			q := e.Value.(*queued)
			q.alert, q.ver = alerts[i], a.ver
			a.order.MoveToBack(e)
			continue
		}
		if len(a.queued) >= maxQueuedAlerts {
			e := a.order.Front()
			for e != nil && e.Value.(*queued).sending {
				e = e.Next()
			}
			if e == nil { // only while maxQueuedAlerts <= maxPostAlerts: the newest is dropped
				a.dropped.Inc()
				continue
			}
			delete(a.queued, e.Value.(*queued).alert.Fingerprint)
			a.order.Remove(e)
			a.dropped.Inc()
		}
		a.queued[alerts[i].Fingerprint] = a.order.PushBack(&queued{alert: alerts[i], ver: a.ver})
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// sent is one alert of a post: its place in the queue and the state change posted.
type sent struct {
	e   *list.Element
	ver uint64
}

// take returns the n least recently changed alerts queued, marked in flight; they stay
// queued until settle.
func (a *Alertmanager) take(n int) ([]events.Alert, []sent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var alerts []events.Alert
	var taken []sent
	for e := a.order.Front(); e != nil && len(alerts) < n; e = e.Next() {
		q := e.Value.(*queued)
		q.sending = true
		alerts = append(alerts, q.alert)
		taken = append(taken, sent{e: e, ver: q.ver})
	}
	return alerts, taken
}

// settle ends the post of taken: once Alertmanager accepted it, each alert whose state
// did not change meanwhile leaves the queue; one that changed stays, to post the newer
// state.
func (a *Alertmanager) settle(taken []sent, posted bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range taken {
		q := s.e.Value.(*queued)
		q.sending = false
		if posted && q.ver == s.ver {
			delete(a.queued, q.alert.Fingerprint)
			a.order.Remove(s.e)
		}
	}
}

// maxPostAlerts bounds the alerts of one post, as Prometheus's notifier does (64): a window
// in which thousands of alerts change (an outage of every series) made one post of
// megabytes, which a proxy's body limit (413) or the timeout refused on every retry, and
// every later alert waited behind it.
const maxPostAlerts = 64

// Run posts queued alerts, at most maxPostAlerts a post, until ctx ends, then makes one
// last attempt, under a timeout of its own, at what is queued (a post cut short by ctx is
// not lost: its alerts stay queued until Alertmanager accepts them).
func (a *Alertmanager) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	failing := false
	for {
		batch, taken := a.take(maxPostAlerts)
		if len(batch) == 0 {
			select {
			case <-a.wake:
				continue
			case <-ctx.Done():
				a.drain()
				return nil
			}
		}
		err := a.post(ctx, batch)
		a.settle(taken, err == nil)
		if err == nil {
			a.posted.Add(float64(len(batch)))
			if failing {
				a.logger.Info("posting to Alertmanager again")
				failing = false
			}
			backoff = 0
			continue
		}
		if ctx.Err() != nil {
			a.drain()
			return nil
		}
		a.failed.Inc()
		if !failing {
			a.logger.Warn("cannot post alerts to Alertmanager; retrying", "err", err)
			failing = true
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 30*time.Second)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			a.drain()
			return nil
		}
	}
}

// drain posts what is queued, once each; what fails is dropped.
func (a *Alertmanager) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), a.client.Timeout)
	defer cancel()
	a.mu.Lock()
	batch := make([]events.Alert, 0, len(a.queued))
	for e := a.order.Front(); e != nil; e = e.Next() {
		batch = append(batch, e.Value.(*queued).alert)
	}
	a.order.Init()
	clear(a.queued)
	a.mu.Unlock()
	for len(batch) > 0 {
		n := min(len(batch), maxPostAlerts)
		if err := a.post(ctx, batch[:n]); err != nil {
			a.dropped.Add(float64(n))
		} else {
			a.posted.Add(float64(n))
		}
		batch = batch[n:]
	}
}

// Body returns the /api/v2/alerts body for alerts.
func (a *Alertmanager) Body(alerts []events.Alert) ([]byte, error) {
	out := make([]amAlert, 0, len(alerts))
	for i := range alerts {
		al := &alerts[i]
		ann := map[string]string{
			"summary":     al.Summary,
			"value":       strconv.FormatFloat(al.Value, 'g', 6, 64),
			"threshold":   strconv.FormatFloat(al.Threshold, 'g', 6, 64),
			"fingerprint": al.Fingerprint,
		}
		if al.BaselineMethod != "" {
			ann["baseline_method"] = al.BaselineMethod
			ann["baseline_center"] = strconv.FormatFloat(al.BaselineCenter, 'g', 6, 64)
			ann["baseline_spread"] = strconv.FormatFloat(al.BaselineSpread, 'g', 6, 64)
		}
		if !al.WindowStart.IsZero() {
			ann["window_start"] = al.WindowStart.UTC().Format(time.RFC3339)
		}
		if !al.JudgedWindowStart.IsZero() {
			ann["judged_window_start"] = al.JudgedWindowStart.UTC().Format(time.RFC3339)
		}
		if al.ResolveReason != "" {
			ann["resolve_reason"] = al.ResolveReason
		}
		if c := al.EngineCause; c != nil {
			ann["engine_cause"] = c.Cause
			ann["engine"] = c.Host + "/" + c.Engine
		}
		x := amAlert{Labels: al.Labels, Annotations: ann, StartsAt: al.StartsAt.UTC()}
		if al.State == events.AlertResolved {
			x.EndsAt = al.At.UTC()
		} else {
			x.EndsAt = al.At.Add(4 * a.resend).UTC()
		}
		out = append(out, x)
	}
	return json.Marshal(out)
}

func (a *Alertmanager) post(ctx context.Context, alerts []events.Alert) error {
	body, err := a.Body(alerts)
	if err != nil {
		return fmt.Errorf("cannot encode alerts for Alertmanager: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("cannot make a request to %s: %w", a.shown, withoutURL(err))
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot post to %s: %w", a.shown, withoutURL(err))
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 == 3 {
		return errors.New(a.scrub(fmt.Sprintf("cannot post to %s: %s: redirected to %s, which is not followed (set ALERTER_ALERTMANAGER_URL to Alertmanager itself)",
			a.shown, resp.Status, ops.RedactURL(resp.Header.Get("Location")))))
	}
	if resp.StatusCode/100 != 2 {
		return errors.New(a.scrub(fmt.Sprintf("cannot post to %s: %s: %s", a.shown, resp.Status, bytes.TrimSpace(msg))))
	}
	return nil
}

// withoutURL returns err without the URL net/http puts in it, which shows the query (where
// a token may be): the message names a.shown instead.
func withoutURL(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}
