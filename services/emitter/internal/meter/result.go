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
	Overflows           int // SSE events past the meter's limit, or a body past MaxBody
	// Unread: of the Overflows, those the meter could not read what it needed of: an event
	// of a protocol other than Responses, a Responses event whose usage was too long to keep,
	// a body. A Responses event past the limit is read as it passes (its type, usage, status
	// and error), so it alone is no failure.
	Unread int
}

// SetInputEstimate gives the input token count to report when the response carries no usage.
func (m *Meter) SetInputEstimate(n int64) { m.inputGuess = n }

// SeenContent reports whether any content has arrived yet.
func (m *Meter) SeenContent() bool { return m.contentCount > 0 }

// Begun reports whether the answer has begun: a stream's first content event, or a body's
// first byte (a body's content is read at its end).
func (m *Meter) Begun() bool {
	return m.contentCount > 0 || (!m.stream && (len(m.body) > 0 || m.bodyOver))
}

// Result returns the measurement of a response whose body ended at end. TTFT is the time to
// the first content event and Total the time to the last; a response without content has
// TTFT 0 and Total up to end. A non-streamed body arrives as a whole, so its TTFT and Total
// are both the time to its end.
func (m *Meter) Result(end time.Time) Result {
	if !m.stream {
		m.parseBody(end)
	}
	r := Result{Usage: m.usage, ContentEvents: m.contentCount, Done: m.done, ErrCode: m.errCode, Malformed: m.malformed,
		Overflows: m.overflows, Unread: m.unread, MaxGap: m.maxGap}
	if m.bodyOver {
		r.Overflows++
		r.Unread++
	}
	if m.contentCount > 0 {
		r.TTFT, r.Total = m.first.Sub(m.start), m.last.Sub(m.start)
	} else {
		r.Total = end.Sub(m.start)
	}
	haveUsage := m.haveUsage
	if haveUsage && !m.usageInRange() {
		// Not a count the contract can hold: the upstream's usage is not trusted, and the
		// response is counted as malformed, rather than lose the request's event.
		haveUsage = false
		r.Malformed++
	}
	if !haveUsage {
		r.Estimated = true
		r.Usage = Usage{Input: m.inputGuess, Output: m.outputGuess()}
	} else {
		// A count the usage leaves out is not a zero: it is estimated as without usage.
		// An Anthropic stream that ended before message_delta has only message_start's
		// output_tokens, a placeholder.
		if !m.inKnown {
			r.Estimated = true
			r.Usage.Input = m.inputGuess
		}
		if (m.proto == Anthropic && !m.finalOut) || (m.proto != Anthropic && !m.outKnown) {
			r.Estimated = true
			r.Usage.Output = m.outputGuess()
		}
	}
	r.Usage.Cached = min(r.Usage.Cached, r.Usage.Input)
	return r
}

// outputGuess is the output tokens of a response without their count: its content events,
// or a body's content bytes / 4.
func (m *Meter) outputGuess() int64 {
	if !m.stream {
		return (m.contentBytes + 3) / 4
	}
	return m.contentCount
}

// usageInRange reports whether every count of the usage reported, Anthropic's input counts
// before they are added up included, is one an event can carry.
func (m *Meter) usageInRange() bool {
	for _, n := range [...]int64{m.usage.Input, m.usage.Output, m.usage.Cached, m.anthropicIn[0], m.anthropicIn[1], m.anthropicIn[2]} {
		if n < 0 || n > events.MaxTokens {
			return false
		}
	}
	return true
}

// Status is how the body itself ended, assuming it was read to its end with a 2xx status:
// an error the upstream reported in the stream, a stream cut before its terminal event, an
// event or body too long to read, or data that is not the protocol's JSON.
func (r *Result) Status(stream bool) (events.Status, string) {
	switch {
	case r.ErrCode != "":
		return events.StatusError, r.ErrCode
	case stream && !r.Done:
		return events.StatusError, CodeTruncated
	case r.Unread > 0:
		return events.StatusError, CodeOverflow
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

// parseBody reads a non-streamed body, whole, as the provider's clients read it. An empty
// one is no JSON either: the clients fail to decode it.
func (m *Meter) parseBody(end time.Time) {
	if m.bodyOver {
		return
	}
	if len(m.body) == 0 || !json.Valid(m.body) {
		m.malformed++
		return
	}
	if m.proto == OpenAIResponses {
		r, ok := readResponse(m.body, true)
		if !ok {
			m.malformed++
			return
		}
		m.response(&r)
		if r.content > 0 {
			m.content(end, r.content)
		}
		m.done = true
		return
	}
	n := 0
	var usage *reported
	var aUsage *anthropicUsage
	var perr *providerError
	ok := object(m.body, func(name, v []byte) (ok bool) {
		switch {
		case string(name) == "usage" && m.proto == Anthropic:
			aUsage, ok = readAnthropicUsage(v)
		case string(name) == "usage":
			usage, ok = openAIUsage(v)
		case string(name) == "error":
			perr, ok = readError(v)
		case string(name) == "content" && m.proto == Anthropic:
			n = 0
			ok = array(v, func(block []byte) bool { k, ok := blockContent(block); n += k; return ok })
		case string(name) == "choices" && m.proto != Anthropic:
			n = 0
			ok = array(v, func(ch []byte) bool { k, ok := choiceContent(ch, "message"); n += k; return ok })
		default:
			ok = true
		}
		return ok
	})
	if !ok {
		m.malformed++
		return
	}
	if usage != nil {
		m.setUsage(usage)
	}
	if aUsage != nil {
		m.mergeAnthropic(aUsage)
		m.finalOut = aUsage.OutputTokens != nil // a body's count is final; an absent one is estimated
	}
	if perr != nil {
		m.errCode = perr.String()
	}
	if n > 0 {
		m.content(end, n)
	}
	m.done = true
}

// blockContent is the content of one of an Anthropic body's content blocks, in bytes.
func blockContent(b []byte) (n int, ok bool) {
	var texts [2]int
	var input []byte
	ok = object(b, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "text":
			texts[0], ok = textLen(v)
		case "thinking":
			texts[1], ok = textLen(v)
		case "input":
			input, ok = v, true
		default:
			ok = true
		}
		return ok
	})
	n = texts[0] + texts[1]
	if present(input) {
		n += len(input)
	}
	return n, ok
}
