package notify

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/bus"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

var at = time.Date(2026, 3, 3, 12, 2, 0, 0, time.UTC)

func alert(state string) events.Alert {
	a := events.Alert{
		V: 1, Fingerprint: "0123456789abcdef", Rule: "ttft_p95_dynamic", State: state, Severity: "warning",
		Labels: map[string]string{"alertname": "ttft_p95_dynamic", "severity": "warning", "scene": "chat.v2"},
		Value:  900, Threshold: 600, BaselineMethod: "mean_sigma", BaselineCenter: 400, BaselineSpread: 100,
		WindowStart: at.Add(-time.Minute), StartsAt: at, At: at,
	}
	if state == events.AlertResolved {
		a.At = at.Add(10 * time.Minute)
		a.EndsAt = a.At
	}
	return a
}

// alertsJS starts NATS with the ALERTS stream and returns a JetStream client on it.
func alertsJS(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := testbed.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 2 * time.Minute, Replicas: 1}, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	return js
}

func streamMsgs(t *testing.T, js jetstream.JetStream) []*jetstream.RawStreamMsg {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, events.StreamAlerts)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestPublishWaitsForJetStream: Publish returns once the ALERTS stream holds the alerts, on
// alerts.<severity>.<rule>, each with a Nats-Msg-Id of fingerprint, transition and window,
// so publishing them again (a retry, a redelivered window) adds nothing to the stream.
func TestPublishWaitsForJetStream(t *testing.T) {
	js := alertsJS(t)
	reg := prometheus.NewRegistry()
	n := New(js, nil, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	alerts := []events.Alert{alert(events.AlertFiring), alert(events.AlertResolved)}
	if err := n.Publish(context.Background(), alerts); err != nil {
		t.Fatal(err)
	}
	msgs := streamMsgs(t, js)
	if len(msgs) != 2 || msgs[0].Subject != "alerts.warning.ttft_p95_dynamic" {
		t.Fatalf("ALERTS holds %d messages (first on %s), want 2 on alerts.warning.ttft_p95_dynamic", len(msgs), msgs[0].Subject)
	}
	ids := []string{msgs[0].Header.Get(jetstream.MsgIDHeader), msgs[1].Header.Get(jetstream.MsgIDHeader)}
	if ids[0] == ids[1] || ids[0] != "0123456789abcdef-firing-"+itoa(at.UnixMilli()) {
		t.Errorf("msg ids %v: want fingerprint-state-millis, distinct per change", ids)
	}
	// The same state changes again: JetStream drops them.
	if err := n.Publish(context.Background(), alerts); err != nil {
		t.Fatal(err)
	}
	if got := len(streamMsgs(t, js)); got != 2 {
		t.Errorf("ALERTS holds %d messages after publishing the same alerts twice, want 2", got)
	}
	if dup, sent := testutil.ToFloat64(n.duplicates), testutil.ToFloat64(n.sent.WithLabelValues("firing", "warning")); dup != 2 || sent != 1 {
		t.Errorf("duplicates %v, firing sent %v; want 2 and 1", dup, sent)
	}
	// A value JSON cannot hold is published as 0, not held back for ever.
	nan := alert(events.AlertFiring)
	nan.At, nan.Value = at.Add(time.Hour), math.NaN()
	if err := n.Publish(context.Background(), []events.Alert{nan}); err != nil {
		t.Fatalf("an alert with a NaN value: %v", err)
	}
	if got := len(streamMsgs(t, js)); got != 3 {
		t.Errorf("ALERTS holds %d messages, want 3", got)
	}
}

// TestPublishFailsWithoutTheStream: when JetStream does not acknowledge an alert, Publish
// says so and counts it, so the caller holds the window's rollups and retries.
func TestPublishFailsWithoutTheStream(t *testing.T) {
	js := alertsJS(t)
	if err := js.DeleteStream(context.Background(), events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	n := New(js, nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.Publish(ctx, []events.Alert{alert(events.AlertFiring)}); err == nil {
		t.Fatal("publishing with no ALERTS stream succeeded")
	}
	if got := testutil.ToFloat64(n.publishErrors); got != 1 {
		t.Errorf("publish errors %v, want 1", got)
	}
	if got := testutil.ToFloat64(n.sent.WithLabelValues("firing", "warning")); got != 0 {
		t.Errorf("sent %v, want 0", got)
	}
}

func itoa(v int64) string { b, _ := json.Marshal(v); return string(b) }

func TestAlertmanager(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]map[string]any
	fail := 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v2/alerts" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if fail > 0 { // the first post fails: it must be retried
			fail--
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		var body []map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		bodies = append(bodies, body)
	}))
	defer srv.Close()
	am := NewAlertmanager(srv.URL+"/", 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- am.Run(ctx) }()
	posts := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			n := len(bodies)
			mu.Unlock()
			if n == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("Alertmanager got %d posts, want %d", n, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	am.Enqueue([]events.Alert{alert(events.AlertFiring)})
	posts(1)
	am.Enqueue([]events.Alert{alert(events.AlertResolved)})
	posts(2)
	cancel()
	<-done
	firing, resolved := bodies[0][0], bodies[1][0]
	if firing["endsAt"] != at.Add(4*time.Hour).Format(time.RFC3339) || firing["startsAt"] != at.Format(time.RFC3339) {
		t.Errorf("firing startsAt %v endsAt %v, want endsAt 4 × resend ahead", firing["startsAt"], firing["endsAt"])
	}
	if resolved["endsAt"] != at.Add(10*time.Minute).Format(time.RFC3339) {
		t.Errorf("resolved endsAt %v", resolved["endsAt"])
	}
	labels := firing["labels"].(map[string]any)
	ann := firing["annotations"].(map[string]any)
	if labels["scene"] != "chat.v2" || ann["baseline_center"] != "400" || ann["threshold"] != "600" || ann["value"] != "900" {
		t.Errorf("labels %v annotations %v", labels, ann)
	}
	if got := testutil.ToFloat64(am.failed); got != 1 {
		t.Errorf("failed posts %v, want 1", got)
	}
}

// A TTFT alert's engine cause reaches Alertmanager as annotations.
func TestAlertmanagerEngineCause(t *testing.T) {
	am := NewAlertmanager("http://127.0.0.1:1/", time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	a := alert(events.AlertFiring)
	a.EngineCause = &events.EngineCause{Cause: events.CauseQueueTime, Host: "gpu1", Engine: "vllm", Reference: "recent"}
	body, err := am.Body([]events.Alert{a, alert(events.AlertFiring)})
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if ann := got[0].Annotations; ann["engine_cause"] != "queue_time" || ann["engine"] != "gpu1/vllm" {
		t.Errorf("annotations %v", ann)
	}
	if _, ok := got[1].Annotations["engine_cause"]; ok {
		t.Errorf("an alert without a cause has one: %v", got[1].Annotations)
	}
}

// A resolved alert's reason reaches Alertmanager as an annotation.
func TestAlertmanagerResolveReason(t *testing.T) {
	am := NewAlertmanager("http://127.0.0.1:1/", time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	a := alert(events.AlertResolved)
	a.ResolveReason = events.ResolvedSilent
	body, err := am.Body([]events.Alert{a, alert(events.AlertFiring)})
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if r := got[0].Annotations["resolve_reason"]; r != "silent" {
		t.Errorf("resolve_reason %q, want silent", r)
	}
	if _, ok := got[1].Annotations["resolve_reason"]; ok {
		t.Errorf("a firing alert has a resolve_reason: %v", got[1].Annotations)
	}
}

// TestAlertmanagerUnreachableSecretsNotLogged: an Alertmanager that cannot be reached,
// behind a URL with a password, a token as its user name or a token in its query: neither
// the log of the failed posts nor the error of a post shows them.
func TestAlertmanagerUnreachableSecretsNotLogged(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, base := range []string{
		"http://am:s3cret@" + addr,
		"http://s3cret@" + addr,
		"http://" + addr + "/?token=s3cret",
		"http://" + addr + "/?api_key=s3cret&x=1",
	} {
		var log syncBuffer
		am := NewAlertmanager(base, time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil)))
		err := am.post(context.Background(), []events.Alert{alert(events.AlertFiring)})
		if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), addr) {
			t.Errorf("%s: post error %v: want one naming %s without the secret", base, err, addr)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- am.Run(ctx) }()
		am.Enqueue([]events.Alert{alert(events.AlertFiring)})
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(am.failed) < 1 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done
		if out := log.String(); !strings.Contains(out, "cannot post") || strings.Contains(out, "s3cret") {
			t.Errorf("%s: log %s", base, out)
		}
	}
}

// TestAlertmanagerPasswordNotLogged: an Alertmanager behind basic auth has its password in
// ALERTER_ALERTMANAGER_URL; it is sent, and a failed post's log does not show it.
func TestAlertmanagerPasswordNotLogged(t *testing.T) {
	var mu sync.Mutex
	var user, pass string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		user, pass, _ = r.BasicAuth()
		mu.Unlock()
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var log syncBuffer
	base := strings.Replace(srv.URL, "http://", "http://am:s3cret@", 1)
	am := NewAlertmanager(base, 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- am.Run(ctx) }()
	am.Enqueue([]events.Alert{alert(events.AlertFiring)})
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(am.failed) < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if user != "am" || pass != "s3cret" {
		t.Errorf("basic auth %q:%q, want the URL's", user, pass)
	}
	if out := log.String(); !strings.Contains(out, "cannot post") || strings.Contains(out, "s3cret") {
		t.Errorf("log %s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger writing from another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAlertmanagerRedirectNotFollowed: Alertmanager's API never redirects, but a proxy in
// front of it may: a 302 or 303 to a login page turned the POST into a GET whose 200 was
// counted as posted while Alertmanager got nothing, and a 307 sent the alerts to another
// host. A redirect is a failed post, retried, and its destination shows redacted.
func TestAlertmanagerRedirectNotFollowed(t *testing.T) {
	var mu sync.Mutex
	var elsewhere []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, r.Method+" "+r.URL.Path)
		mu.Unlock()
	}))
	defer other.Close()
	for _, code := range []int{http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/login?token=s3cret", code)
		}))
		var log syncBuffer
		am := NewAlertmanager(proxy.URL, 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil)))
		err := am.post(context.Background(), []events.Alert{alert(events.AlertFiring)})
		if err == nil || !strings.Contains(err.Error(), strconv.Itoa(code)) || !strings.Contains(err.Error(), other.URL+"/login") || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%d: post error %v, want one naming the status and the redirect redacted", code, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- am.Run(ctx) }()
		am.Enqueue([]events.Alert{alert(events.AlertFiring)})
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(am.failed) < 1 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done
		proxy.Close()
		if f, p := testutil.ToFloat64(am.failed), testutil.ToFloat64(am.posted); f < 1 || p != 0 {
			t.Errorf("%d: %v failed posts, %v alerts counted posted; want failures and none posted", code, f, p)
		}
		if out := log.String(); strings.Contains(out, "s3cret") {
			t.Errorf("%d: log %s", code, out)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(elsewhere) > 0 {
		t.Errorf("the redirect's host got %v", elsewhere)
	}
}

// TestAlertmanagerGetsEachAlertsLatestState: while Alertmanager is away an alert fires and
// resolves, and other alerts change; once back it gets the alert resolved. Before, the post
// retried (the fire) was held outside the queue of batches, a full queue dropped its
// oldest batch (the resolve), and Alertmanager showed the alert firing until its endsAt,
// hours after it resolved.
func TestAlertmanagerGetsEachAlertsLatestState(t *testing.T) {
	var mu sync.Mutex
	up := false
	var states []string // the states posted of alert 0123456789abcdef, in order
	others := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			http.Error(w, "away", http.StatusServiceUnavailable)
			return
		}
		var body []struct {
			Annotations map[string]string `json:"annotations"`
			EndsAt      time.Time         `json:"endsAt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, a := range body {
			if fp := a.Annotations["fingerprint"]; fp != "0123456789abcdef" {
				others[fp] = true
				continue
			}
			st := events.AlertFiring
			if !a.EndsAt.After(at.Add(10 * time.Minute)) {
				st = events.AlertResolved
			}
			states = append(states, st)
		}
	}))
	defer srv.Close()
	am := NewAlertmanager(srv.URL, 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- am.Run(ctx) }()
	defer func() { cancel(); <-done }()
	am.Enqueue([]events.Alert{alert(events.AlertFiring)}) // taken, failing, retried
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(am.failed) < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	am.Enqueue([]events.Alert{alert(events.AlertResolved)}) // a window later
	const changed = 1024                                    // other alerts, one window each
	for i := range changed {
		o := alert(events.AlertFiring)
		o.Fingerprint = strconv.Itoa(i)
		o.At = at.Add(time.Duration(20+i) * time.Minute)
		am.Enqueue([]events.Alert{o})
	}
	mu.Lock()
	up = true
	mu.Unlock()
	deadline = time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(am.posted) < changed+1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(states) == 0 || states[len(states)-1] != events.AlertResolved || len(others) != changed {
		t.Fatalf("Alertmanager got %v for the alert that fired and resolved, and %d other alerts; want it last resolved, and %d others", states, len(others), changed)
	}
	if d := testutil.ToFloat64(am.dropped); d != 0 {
		t.Errorf("%v alerts dropped, want none", d)
	}
}

// TestAlertmanagerQueueBounded: while a post hangs, more distinct alerts than the queue
// holds change; the least recently changed ones are dropped and counted, never the one in
// flight, and what Alertmanager gets once back ends with the latest.
func TestAlertmanagerQueueBounded(t *testing.T) {
	var mu sync.Mutex
	got := map[string]bool{} // fingerprints posted
	arrived, release := make(chan struct{}), make(chan struct{})
	first := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []struct {
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		if first { // hangs, then fails: retried
			first = false
			mu.Unlock()
			close(arrived)
			<-release
			http.Error(w, "away", http.StatusServiceUnavailable)
			return
		}
		defer mu.Unlock()
		for _, a := range body {
			got[a.Annotations["fingerprint"]] = true
		}
	}))
	defer srv.Close()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock() // before srv.Close, which waits for the post hanging
	am := NewAlertmanager(srv.URL, 30*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- am.Run(ctx) }()
	defer func() { cancel(); <-done }()
	fired := func(fp string) []events.Alert {
		a := alert(events.AlertFiring)
		a.Fingerprint = fp
		return []events.Alert{a}
	}
	am.Enqueue(fired("in flight"))
	<-arrived
	const over = 5
	for i := range maxQueuedAlerts + over {
		am.Enqueue(fired(strconv.Itoa(i)))
	}
	// The one in flight holds a place: over+1 are dropped, the oldest.
	if d := testutil.ToFloat64(am.dropped); d != over+1 {
		t.Fatalf("%v alerts dropped, want %d", d, over+1)
	}
	unblock()
	deadline := time.Now().Add(60 * time.Second)
	for testutil.ToFloat64(am.posted) < maxQueuedAlerts && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != maxQueuedAlerts || !got["in flight"] || got[strconv.Itoa(over)] || !got[strconv.Itoa(over+1)] || !got[strconv.Itoa(maxQueuedAlerts+over-1)] {
		t.Fatalf("Alertmanager got %d alerts (in flight %v, #%d %v, #%d %v, the latest %v), want %d: the one in flight and the latest",
			len(got), got["in flight"], over, got[strconv.Itoa(over)], over+1, got[strconv.Itoa(over+1)], got[strconv.Itoa(maxQueuedAlerts+over-1)], maxQueuedAlerts)
	}
}

// TestAlertmanagerPostsBounded: a window in which hundreds of alerts change is posted in
// posts of at most 64 alerts, as Prometheus posts them; one post of them all was refused
// on every retry by a proxy's body limit (413 here past 64 alerts), and nothing after it
// got through either.
func TestAlertmanagerPostsBounded(t *testing.T) {
	var mu sync.Mutex
	got := map[string]bool{}
	biggest := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []struct {
			Annotations map[string]string `json:"annotations"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		biggest = max(biggest, len(body))
		if len(body) > 64 {
			http.Error(w, "request entity too large", http.StatusRequestEntityTooLarge)
			return
		}
		for _, a := range body {
			got[a.Annotations["fingerprint"]] = true
		}
	}))
	defer srv.Close()
	am := NewAlertmanager(srv.URL, 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- am.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var alerts []events.Alert
	for i := range 200 {
		a := alert(events.AlertFiring)
		a.Fingerprint = strconv.Itoa(i)
		alerts = append(alerts, a)
	}
	am.Enqueue(alerts)
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(am.posted) < 200 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 200 || biggest > 64 || testutil.ToFloat64(am.posted) != 200 {
		t.Fatalf("Alertmanager got %d distinct alerts, %v counted posted, the biggest post %d alerts; want 200 in posts of at most 64", len(got), testutil.ToFloat64(am.posted), biggest)
	}
}

// failOnce fails the publish numbered fail (from 1), once, and passes the others on.
type failOnce struct {
	js   jetstream.JetStream
	n    int
	fail int
}

func (f *failOnce) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	f.n++
	if f.n == f.fail {
		return nil, errors.New("nats: timeout")
	}
	return f.js.PublishMsg(ctx, m, opts...)
}

// TestRetryPublishesOnlyWhatWasNotTaken: a publish that fails part way through a window's
// alerts is retried with the alerts JetStream did not take; before, the retry published
// the ones it had taken again, and past the stream's duplicate window (an outage longer
// than it) JetStream kept them twice: subscribers of alerts.> saw a state change twice.
func TestRetryPublishesOnlyWhatWasNotTaken(t *testing.T) {
	_, js := testbed.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := bus.EnsureStreams(ctx, js, bus.StreamLimits{MaxBytes: 1 << 30, DuplicateWindow: 200 * time.Millisecond, Replicas: 1}, events.StreamAlerts); err != nil {
		t.Fatal(err)
	}
	n := New(&failOnce{js: js, fail: 2}, nil, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	alerts := []events.Alert{alert(events.AlertFiring), alert(events.AlertResolved)}
	if err := n.Publish(ctx, alerts); err == nil {
		t.Fatal("the failed publish was not reported")
	}
	time.Sleep(500 * time.Millisecond) // past the duplicate window
	if err := n.Publish(ctx, alerts); err != nil {
		t.Fatal(err)
	}
	msgs := streamMsgs(t, js)
	var ids []string
	for _, m := range msgs {
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	if len(msgs) != 2 || ids[0] == ids[1] {
		t.Fatalf("ALERTS holds %v, want each state change once", ids)
	}
	if got := testutil.ToFloat64(n.sent.WithLabelValues("firing", "warning")) + testutil.ToFloat64(n.sent.WithLabelValues("resolved", "warning")); got != 2 {
		t.Errorf("sent %v, want 2", got)
	}
}

// TestAlertmanagerAnswerSecretsNotLogged: a proxy before Alertmanager that echoes the
// request in its error (Express's "Cannot POST /api/v2/alerts?token=…", a debug page
// showing the credentials) put the URL's token or password into the post error and the
// log; they are hidden there.
func TestAlertmanagerAnswerSecretsNotLogged(t *testing.T) {
	for _, tc := range []struct{ base, answer string }{
		{"?token=s3cret-t0ken", "Cannot POST /api/v2/alerts?token=s3cret-t0ken"},
		{"?t=s3cret-t0ken&x=1", "Cannot POST /api/v2/alerts?t=s3cret-t0ken&x=1"},
		{"am:s3cret-pw@", "no such user am with password s3cret-pw"},
		{"am:s3cret-pw@", "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("am:s3cret-pw"))},
		{"s3cret-t0ken@", "unknown key s3cret-t0ken"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, tc.answer, http.StatusNotFound)
		}))
		base := srv.URL
		if strings.HasSuffix(tc.base, "@") {
			base = strings.Replace(srv.URL, "http://", "http://"+tc.base, 1)
		} else {
			base += "/" + tc.base
		}
		var log syncBuffer
		am := NewAlertmanager(base, 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&log, nil)))
		err := am.post(context.Background(), []events.Alert{alert(events.AlertFiring)})
		basic := base64.StdEncoding.EncodeToString([]byte("am:s3cret-pw"))
		if err == nil || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), basic) || !strings.Contains(err.Error(), "404") {
			t.Errorf("%s: post error %v, want the 404 without the secret", tc.base, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- am.Run(ctx) }()
		am.Enqueue([]events.Alert{alert(events.AlertFiring)})
		deadline := time.Now().Add(10 * time.Second)
		for testutil.ToFloat64(am.failed) < 1 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done
		srv.Close()
		if out := log.String(); !strings.Contains(out, "cannot post") || strings.Contains(out, "s3cret") || strings.Contains(out, basic) {
			t.Errorf("%s: log %s", tc.base, out)
		}
	}
}

// TestAlertmanagerURLWithQuery: an ALERTER_ALERTMANAGER_URL with a path and a query (a
// token a proxy before Alertmanager wants) posts to <path>/api/v2/alerts with the query
// kept; the API path used to be appended after the query, so the posts went to the base
// path with a garbled token and failed for good.
func TestAlertmanagerURLWithQuery(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.Path+" token="+r.URL.Query().Get("token"))
		mu.Unlock()
		if r.URL.Path != "/am/api/v2/alerts" || r.URL.Query().Get("token") != "abc" {
			http.Error(w, "not found", http.StatusNotFound)
		}
	}))
	defer srv.Close()
	for _, base := range []string{srv.URL + "/am/?token=abc", srv.URL + "/am?token=abc"} {
		am := NewAlertmanager(base, 5*time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err := am.post(context.Background(), []events.Alert{alert(events.AlertFiring)}); err != nil {
			mu.Lock()
			t.Errorf("%s: %v (requests %v)", base, err, got)
			mu.Unlock()
		}
	}
}

// A held alert's latest judged window reaches Alertmanager as an annotation, so a page
// re-sent while its series is too thin to judge says since when.
func TestAlertmanagerJudgedWindowStart(t *testing.T) {
	am := NewAlertmanager("http://127.0.0.1:1/", time.Second, time.Hour, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	a := alert(events.AlertFiring)
	a.JudgedWindowStart = time.Date(2026, 3, 3, 12, 7, 0, 0, time.UTC)
	body, err := am.Body([]events.Alert{a, alert(events.AlertResolved)})
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if j := got[0].Annotations["judged_window_start"]; j != "2026-03-03T12:07:00Z" {
		t.Errorf("judged_window_start %q, want 2026-03-03T12:07:00Z", j)
	}
	if _, ok := got[1].Annotations["judged_window_start"]; ok {
		t.Errorf("a resolved alert has a judged_window_start: %v", got[1].Annotations)
	}
}
