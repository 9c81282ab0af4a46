package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/ops"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
	"github.com/tokenscope/tokenscope/services/emitter/internal/replay"
)

type incidentFlags []replay.Incident

func (f *incidentFlags) String() string { return fmt.Sprint(len(*f)) }
func (f *incidentFlags) Set(s string) error {
	in, err := replay.ParseIncident(s)
	if err == nil {
		*f = append(*f, in)
	}
	return err
}

func runReplay(ctx context.Context, args []string, environ map[string]string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tracePath := fs.String("trace", "", "Azure trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens); empty generates a workload")
	shape := fs.String("shape", "conversation", "generated workload shape: conversation or code")
	duration := fs.Duration("duration", 10*time.Minute, "length of a generated workload (trace time)")
	speed := fs.Float64("speed", 1, "speed factor: 10 plays ten times faster than recorded")
	loop := fs.Bool("loop", false, "start over at the end until interrupted (demo load)")
	limit := fs.Int("limit", 0, "play only the first N requests (0: all)")
	simulate := fs.Bool("simulate", false, "do not call an endpoint: publish events from the latency model")
	url := fs.String("url", "http://127.0.0.1:8080", "endpoint base URL when not simulating")
	protocol := fs.String("protocol", "openai", "openai, openai-completions or anthropic")
	stream := fs.Bool("stream", true, "stream the responses (SSE)")
	concurrency := fs.Int("concurrency", 512, "requests in flight at most when not simulating")
	model := fs.String("model", "llama-3-70b", "model name of the requests and events")
	scene := fs.String("scene", "", "scene of the events (default: the shape's or the trace's name)")
	envName := fs.String("env", "dev", "env of the events")
	instance := fs.String("instance", "", "instance of the events (default sim-1 when simulating)")
	seed := fs.Uint64("seed", 1, "random seed of the generator and the model")
	publish := fs.Bool("publish", true, "publish events to NATS (NATS_* variables)")
	feedback := fs.Float64("feedback", 0, "the share of answers (0–1; of conversations against an endpoint) simulated users rate, thumbs and ratings worse the slower the first token and the longer the stalls; against an endpoint the verdicts go to -url's POST /v1/feedback (an emitter's) and need -turns")
	turns := fs.Float64("turns", 0, "mean turns of the simulated users' conversations (0: requests are in no conversation); each conversation ends completed or abandoned, less often completed after slow or failed turns")
	m := replay.DefaultModel
	fs.DurationVar(&m.BaseTTFT, "model-ttft", m.BaseTTFT, "model: base TTFT")
	fs.DurationVar(&m.PrefillPerToken, "model-prefill", m.PrefillPerToken, "model: TTFT per input token")
	fs.DurationVar(&m.BaseTPOT, "model-tpot", m.BaseTPOT, "model: base TPOT")
	fs.Float64Var(&m.QueuePerLoad, "model-queue", m.QueuePerLoad, "model: TTFT growth per request in flight")
	fs.Float64Var(&m.DecodePerLoad, "model-decode", m.DecodePerLoad, "model: TPOT growth per request in flight")
	fs.Float64Var(&m.ErrorRate, "model-errors", m.ErrorRate, "model: error rate")
	var incidents incidentFlags
	fs.Var(&incidents, "incident", "with -simulate, inject an incident into the latency model: start=10m,for=2m,ttft=4,tpot=2,errors=0.1 (repeatable)")
	var burst *replay.Burst
	fs.Func("burst", "against an endpoint, a recurring incident of real load: at=40s,for=40s,every=2m,clients=192 (the default of each part left out; wall-clock time) keeps clients more requests in flight from at after the start, for for, every every", func(v string) error {
		b, err := replay.ParseBurst(v)
		if err == nil {
			burst = &b
		}
		return err
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !(*speed > 0) || math.IsInf(*speed, 0) { // NaN too
		return fmt.Errorf("-speed=%g must be a positive number", *speed)
	}
	if err := m.Validate(); err != nil {
		return err
	}
	// Each incident acts on one kind of load: the model's latencies, or the endpoint's queue.
	if *simulate && burst != nil {
		return errors.New("-burst sends real requests to -url and does not go with -simulate (whose incidents are -incident's)")
	}
	if !*simulate && len(incidents) > 0 {
		return errors.New("-incident changes the latency model of -simulate; against an endpoint, -burst makes an incident of real load")
	}
	var (
		records []replay.Record
		name    string
	)
	if *tracePath != "" {
		f, err := os.Open(*tracePath)
		if err != nil {
			return fmt.Errorf("cannot open -trace: %w", err)
		}
		records, err = replay.ReadTrace(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("cannot read %s: %w", *tracePath, err)
		}
		name = "conversation"
		if strings.Contains(strings.ToLower(*tracePath), "code") {
			name = "code"
		}
	} else {
		s := replay.Conversation
		switch *shape {
		case "conversation":
		case "code":
			s = replay.Code
		default:
			return fmt.Errorf("-shape=%q is not conversation or code", *shape)
		}
		records, name = replay.Generate(s, *duration, *seed), s.Name
	}
	if *limit > 0 && *limit < len(records) {
		records = records[:*limit]
	}
	if *scene == "" {
		*scene = name
	}
	var burstTarget *replay.Target
	opts := replay.Options{Speed: *speed, Loop: *loop, Model: *model, Scene: *scene, Env: *envName, Instance: *instance}
	if *simulate {
		opts.Simulator = replay.NewSimulator(m, incidents, *seed)
		if opts.Instance == "" {
			opts.Instance = "sim-1"
		}
	} else {
		proto, err := llmclient.ParseProtocol(*protocol)
		if err != nil {
			return fmt.Errorf("-protocol: %w", err)
		}
		key := environ["OPENAI_API_KEY"]
		if proto.Provider() == "anthropic" {
			key = environ["ANTHROPIC_API_KEY"]
		}
		tr := &http.Transport{MaxIdleConnsPerHost: *concurrency, DisableCompression: true}
		opts.Target = &replay.Target{Stream: *stream, Concurrency: *concurrency,
			Client: &llmclient.Client{BaseURL: *url, APIKey: key, Protocol: proto, HTTP: &http.Client{Transport: tr, Timeout: 600 * time.Second}}}
		if burst != nil {
			burstTarget = replay.NewBurstTarget(opts.Target.Client, *stream, burst.Clients)
		}
	}
	if !(*feedback >= 0 && *feedback <= 1) || (*feedback > 0 && !*simulate && *turns == 0) {
		return fmt.Errorf("-feedback=%g must be between 0 and 1, and goes with -simulate or -turns", *feedback)
	}
	if !(*turns == 0 || *turns >= 1 && *turns <= 50) {
		return fmt.Errorf("-turns=%g must be 0 or from 1 to 50", *turns)
	}
	if *turns > 0 {
		opts.Conversations = replay.NewConversations(*turns, *seed)
	}
	em, stop, err := publishing(ctx, environ, *publish, stderr)
	if err != nil {
		return fmt.Errorf("%w (run with -publish=false to replay without NATS)", err)
	}
	if *feedback > 0 {
		var fe replay.FeedbackEmitter = em
		if !*simulate {
			fe = &feedbackPoster{url: strings.TrimSuffix(strings.TrimSuffix(*url, "/"), "/v1") + "/v1/feedback",
				token: environ["EMITTER_INGEST_TOKEN"], client: &http.Client{Timeout: 10 * time.Second}}
		}
		opts.Users = replay.NewUsers(*feedback, fe, *seed)
	}
	var stats replay.Stats
	fmt.Fprintf(stderr, "replaying %d requests (%s, scene %s) at %gx\n", len(records), name, *scene, *speed)
	if burst != nil {
		fmt.Fprintf(stderr, "burst: %d more clients for %s of every %s, from %s in\n", burst.Clients, burst.For, burst.Every, burst.At)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if burstTarget == nil {
			replay.Run(ctx, records, opts, em, &stats)
			return
		}
		// The burst lasts as long as the replay: it ends when the records do (without -loop).
		rctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			replay.RunBurst(rctx, *burst, time.Now(), burstTarget, opts, em, &stats)
		}()
		replay.Run(ctx, records, opts, em, &stats)
		stop()
		wg.Wait()
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	line := func() string {
		s := fmt.Sprintf("sent %d  ok %d  errors %d  timeouts %d  canceled %d  skipped %d  feedback %d  unpublished %d",
			stats.Sent.Load(), stats.OK.Load(), stats.Errors.Load(), stats.Timeouts.Load(), stats.Canceled.Load(),
			stats.Skipped.Load(), stats.Feedback.Load(), stats.Unpublished.Load())
		if burst != nil {
			s += fmt.Sprintf("  burst %d (ok %d)", stats.Burst.Load(), stats.BurstOK.Load())
		}
		return s
	}
wait:
	for {
		select {
		case <-done:
			break wait
		case <-tick.C:
			fmt.Fprintf(stderr, "\r%s", line())
		}
	}
	fmt.Fprintf(stderr, "\r")
	fmt.Fprintln(stdout, line())
	return stop()
}

// feedbackPoster sends each verdict to an emitter's POST /v1/feedback, as an app behind the
// proxy does, with EMITTER_INGEST_TOKEN when set.
type feedbackPoster struct {
	url, token string
	client     *http.Client
}

func (p *feedbackPoster) EmitFeedback(fb *events.FeedbackEvent, now time.Time) error {
	if err := fb.ValidateAt(now); err != nil {
		return err
	}
	req, err := http.NewRequest(http.MethodPost, p.url, bytes.NewReader(events.AppendFeedback(nil, fb)))
	if err != nil {
		return fmt.Errorf("cannot send feedback: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot send feedback: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("cannot send feedback: %s answered %d", ops.RedactURL(p.url), resp.StatusCode)
	}
	return nil
}
