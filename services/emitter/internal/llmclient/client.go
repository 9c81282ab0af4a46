package llmclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// Client sends requests to one endpoint.
type Client struct {
	BaseURL  string // such as http://127.0.0.1:8080 or https://api.openai.com; a trailing /v1 is fine
	APIKey   string
	Protocol meter.Protocol
	HTTP     *http.Client
	Header   http.Header // extra headers, such as X-Tokenscope-Scene
}

// ParseProtocol reads "openai", "openai-completions" or "anthropic".
func ParseProtocol(s string) (meter.Protocol, error) {
	switch strings.ToLower(s) {
	case "openai", "chat":
		return meter.OpenAIChat, nil
	case "openai-completions", "completions":
		return meter.OpenAICompletions, nil
	case "anthropic":
		return meter.Anthropic, nil
	}
	return 0, fmt.Errorf("protocol %q is not openai, openai-completions or anthropic", s)
}

// Request is one generation.
type Request struct {
	Model     string
	Prompt    string
	MaxTokens int
	Stream    bool
}

// Outcome is one measured request.
type Outcome struct {
	Start      time.Time
	Result     meter.Result
	Status     events.Status
	ErrCode    string
	HTTPStatus int
}

func (c *Client) body(req Request) ([]byte, string) {
	base := strings.TrimSuffix(strings.TrimSuffix(c.BaseURL, "/"), "/v1")
	switch c.Protocol {
	case meter.Anthropic:
		b, _ := json.Marshal(map[string]any{"model": req.Model, "max_tokens": req.MaxTokens, "stream": req.Stream,
			"messages": []map[string]string{{"role": "user", "content": req.Prompt}}})
		return b, base + "/v1/messages"
	case meter.OpenAICompletions:
		m := map[string]any{"model": req.Model, "max_tokens": req.MaxTokens, "stream": req.Stream, "prompt": req.Prompt}
		if req.Stream {
			m["stream_options"] = map[string]bool{"include_usage": true}
		}
		b, _ := json.Marshal(m)
		return b, base + "/v1/completions"
	default:
		m := map[string]any{"model": req.Model, "max_tokens": req.MaxTokens, "stream": req.Stream,
			"messages": []map[string]string{{"role": "user", "content": req.Prompt}}}
		if req.Stream {
			m["stream_options"] = map[string]bool{"include_usage": true}
		}
		b, _ := json.Marshal(m)
		return b, base + "/v1/chat/completions"
	}
}

// Do sends req and measures the answer; it never returns an error: failures are outcomes.
func (c *Client) Do(ctx context.Context, req Request) Outcome {
	body, url := c.body(req)
	out := Outcome{Start: time.Now()}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		out.Status, out.ErrCode = events.StatusError, "bad_request"
		return out
	}
	// A fake LLM (emitter fakellm) reads this as the length to say, so that a replay or a
	// benchmark gets the token counts it asks for and a natural end; a real model ignores it.
	hr.Header.Set("X-Fakellm-Tokens", strconv.Itoa(req.MaxTokens))
	for k, v := range c.Header {
		hr.Header[k] = v
	}
	hr.Header.Set("Content-Type", "application/json")
	if c.Protocol == meter.Anthropic {
		hr.Header.Set("anthropic-version", "2023-06-01")
		if c.APIKey != "" {
			hr.Header.Set("x-api-key", c.APIKey)
		}
	} else if c.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	resp, err := c.HTTP.Do(hr)
	if err != nil {
		out.Result.Total = time.Since(out.Start)
		switch {
		case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
			out.Status, out.ErrCode = events.StatusTimeout, "upstream_timeout"
		case ctx.Err() != nil:
			out.Status, out.ErrCode = events.StatusCanceled, "canceled"
		default:
			out.Status, out.ErrCode = events.StatusError, "upstream_unreachable"
		}
		return out
	}
	defer resp.Body.Close()
	out.HTTPStatus = resp.StatusCode
	stream := req.Stream && resp.StatusCode < 300 && meter.IsEventStream(resp.Header.Get("Content-Type"))
	m := meter.New(c.Protocol, stream, out.Start)
	m.SetInputEstimate(int64(len(strings.Fields(req.Prompt))))
	buf := make([]byte, 8<<10)
	var readErr error
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			m.Feed(buf[:n], time.Now(), nil)
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	end := time.Now()
	m.Flush(end, nil)
	out.Result = m.Result(end)
	switch {
	case readErr != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		out.Status, out.ErrCode = events.StatusTimeout, "stream_idle"
	case readErr != nil && ctx.Err() != nil:
		out.Status, out.ErrCode = events.StatusCanceled, "canceled"
	case resp.StatusCode >= 300:
		out.Status, out.ErrCode = events.StatusError, strconv.Itoa(resp.StatusCode)
	case readErr != nil:
		out.Status, out.ErrCode = events.StatusError, "upstream_disconnect"
	default:
		out.Status, out.ErrCode = out.Result.Status(stream)
	}
	return out
}

// Event turns the outcome into a request event.
func (o *Outcome) Event(model, scene, env, provider, instance string, stream bool) *events.RequestEvent {
	ev := &events.RequestEvent{V: events.Version, EventID: events.NewEventID(), TS: o.Start.UTC(), Model: model,
		Scene: scene, Env: env, Provider: provider, Instance: instance, Status: o.Status, ErrorCode: o.ErrCode,
		HTTPStatus: o.HTTPStatus, Stream: stream}
	o.Result.Fill(ev)
	return ev
}

var words = strings.Fields(`alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar
papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu`)

// Prompt returns a prompt of about n tokens (words of the NATO alphabet, one token each for
// most tokenizers), so a bench or a replay asks for the input length it means to test.
func Prompt(n int, seed int) string {
	var b strings.Builder
	b.Grow(n * 7)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[(i*7+seed)%len(words)])
	}
	return b.String()
}
