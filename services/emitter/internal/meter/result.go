package meter

import (
	"encoding/json"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// CodeMalformedBody is the error code of a non-streamed 2xx body that is not the protocol's JSON.
const CodeMalformedBody = "malformed_body"

// Result is what the meter measured.
type Result struct {
	TTFT, Total, MaxGap time.Duration
	Usage               Usage
	Estimated           bool  // no usage was reported: Usage holds estimates
	ContentEvents       int64 // SSE events that carried content (1 for a non-streamed body with content)
	Done                bool  // the terminal event ([DONE], message_stop) arrived
	ErrCode             string
	Malformed           int // data lines that were not the protocol's JSON
}

// SetInputEstimate gives the input token count to report when the response carries no usage.
func (m *Meter) SetInputEstimate(n int64) { m.inputGuess = n }

// SeenContent reports whether any content has arrived yet.
func (m *Meter) SeenContent() bool { return m.contentCount > 0 }

// Result returns the measurement of a response whose body ended at end. TTFT is the time to
// the first content event and Total the time to the last; a response without content has
// TTFT 0 and Total up to end. A non-streamed body arrives as a whole, so its TTFT and Total
// are both the time to its end.
func (m *Meter) Result(end time.Time) Result {
	if !m.stream {
		m.parseBody(end)
	}
	r := Result{Usage: m.usage, ContentEvents: m.contentCount, Done: m.done, ErrCode: m.errCode, Malformed: m.malformed, MaxGap: m.maxGap}
	if m.contentCount > 0 {
		r.TTFT, r.Total = m.first.Sub(m.start), m.last.Sub(m.start)
	} else {
		r.Total = end.Sub(m.start)
	}
	if !m.haveUsage {
		r.Estimated = true
		r.Usage = Usage{Input: m.inputGuess, Output: m.contentCount}
		if !m.stream {
			r.Usage.Output = (m.contentBytes + 3) / 4
		}
	}
	r.Usage.Cached = min(r.Usage.Cached, r.Usage.Input)
	return r
}

// Status is how the body itself ended, assuming it was read to its end with a 2xx status:
// an error the upstream reported in the stream, a stream cut before its terminal event, or
// data that is not the protocol's JSON.
func (r *Result) Status(stream bool) (events.Status, string) {
	switch {
	case r.ErrCode != "":
		return events.StatusError, r.ErrCode
	case stream && !r.Done:
		return events.StatusError, CodeTruncated
	case r.Malformed > 0 && stream:
		return events.StatusError, CodeMalformed
	case r.Malformed > 0:
		return events.StatusError, CodeMalformedBody
	}
	return events.StatusOK, ""
}

// Fill copies the durations and tokens into ev.
func (r *Result) Fill(ev *events.RequestEvent) {
	ev.TTFTMs = ms(r.TTFT)
	ev.TotalMs = ms(r.Total)
	ev.MaxITLMs = ms(r.MaxGap)
	ev.InputTokens, ev.OutputTokens, ev.CachedInputTokens = r.Usage.Input, r.Usage.Output, r.Usage.Cached
	ev.TokensEstimated = r.Estimated
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type openAIBody struct {
	Choices []struct {
		Message struct {
			Content   string          `json:"content"`
			Reasoning string          `json:"reasoning_content"`
			ToolCalls json.RawMessage `json:"tool_calls"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *openAIUsage   `json:"usage"`
	Error *providerError `json:"error"`
}

type anthropicBody struct {
	Type    string `json:"type"`
	Content []struct {
		Text     string          `json:"text"`
		Thinking string          `json:"thinking"`
		Input    json.RawMessage `json:"input"`
	} `json:"content"`
	Usage *anthropicUsage `json:"usage"`
	Error *providerError  `json:"error"`
}

func (m *Meter) parseBody(end time.Time) {
	if m.bodyOver || len(m.body) == 0 {
		return
	}
	n := 0
	if m.proto == Anthropic {
		var b anthropicBody
		if err := json.Unmarshal(m.body, &b); err != nil {
			m.malformed++
			return
		}
		for _, c := range b.Content {
			n += len(c.Text) + len(c.Thinking)
			if present(c.Input) {
				n += len(c.Input)
			}
		}
		if b.Usage != nil {
			m.mergeAnthropic(b.Usage)
		}
		if b.Error != nil {
			m.errCode = b.Error.code()
		}
	} else {
		var b openAIBody
		if err := json.Unmarshal(m.body, &b); err != nil {
			m.malformed++
			return
		}
		for _, c := range b.Choices {
			n += len(c.Message.Content) + len(c.Message.Reasoning) + len(c.Text)
			if present(c.Message.ToolCalls) {
				n += len(c.Message.ToolCalls)
			}
		}
		if b.Usage != nil {
			m.usage, m.haveUsage = b.Usage.usage(), true
		}
		if b.Error != nil {
			m.errCode = b.Error.code()
		}
	}
	if n > 0 {
		m.content(end, n)
	}
	m.done = true
}
