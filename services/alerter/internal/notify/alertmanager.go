package notify

import (
	"bytes"
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
// Alertmanager never holds up evaluation. A failed post is retried with backoff while newer
// alerts wait in a bounded queue; past it the oldest are dropped and counted.
type Alertmanager struct {
	url     string
	shown   string   // url redacted (ops.RedactURL), for errors and logs
	secrets []string // the URL's user information and query values, hidden in answers shown
	client  *http.Client
	resend  time.Duration
	in      chan []events.Alert
	logger  *slog.Logger
	posted  prometheus.Counter
	failed  prometheus.Counter
	dropped prometheus.Counter
}

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
		in:      make(chan []events.Alert, 1024),
		logger:  logger.With("component", "alertmanager"),
		posted:  c("alertmanager_alerts_posted_total", "Alerts Alertmanager accepted."),
		failed:  c("alertmanager_post_errors_total", "Posts to Alertmanager that failed (and were retried)."),
		dropped: c("alertmanager_alerts_dropped_total", "Alerts dropped because Alertmanager was away too long."),
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

// Enqueue queues alerts for posting; it never blocks. A full queue drops its oldest batch,
// so the latest state changes (a resolve, the newest re-send) are the ones kept; one
// goroutine enqueues.
func (a *Alertmanager) Enqueue(alerts []events.Alert) {
	batch := append([]events.Alert(nil), alerts...)
	for {
		select {
		case a.in <- batch:
			return
		default:
		}
		select {
		case old := <-a.in:
			a.dropped.Add(float64(len(old)))
		default:
		}
	}
}

// maxPostAlerts bounds the alerts of one post, as Prometheus's notifier does (64): a window
// in which thousands of alerts change (an outage of every series) made one post of
// megabytes, which a proxy's body limit (413) or the timeout refused on every retry, and
// every later alert waited behind it.
const maxPostAlerts = 64

// Run posts queued alerts, at most maxPostAlerts a post, until ctx ends, then makes one last attempt, under a timeout of
// its own, at the batch it was posting (a post cut short by ctx is not lost) and at what
// is queued.
func (a *Alertmanager) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	failing := false
	for {
		var batch []events.Alert
		select {
		case batch = <-a.in:
		case <-ctx.Done():
			a.drain(nil)
			return nil
		}
		for len(batch) > 0 {
			n := min(len(batch), maxPostAlerts)
			err := a.post(ctx, batch[:n])
			if err == nil {
				a.posted.Add(float64(n))
				batch = batch[n:]
				if failing {
					a.logger.Info("posting to Alertmanager again")
					failing = false
				}
				backoff = 0
				continue
			}
			if ctx.Err() != nil {
				a.drain(batch)
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
				a.drain(batch)
				return nil
			}
		}
	}
}

// drain posts first, if any, and then what is queued, once each.
func (a *Alertmanager) drain(first []events.Alert) {
	ctx, cancel := context.WithTimeout(context.Background(), a.client.Timeout)
	defer cancel()
	send := func(batch []events.Alert) {
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
	if len(first) > 0 {
		send(first)
	}
	for {
		select {
		case batch := <-a.in:
			send(batch)
		default:
			return
		}
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
