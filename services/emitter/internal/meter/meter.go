package meter

import (
	"bytes"
	"encoding/json"
	"sync"
	"time"
)

// Protocol is the API dialect of a request.
type Protocol uint8

// The protocols the meter understands.
const (
	OpenAIChat        Protocol = iota // POST /v1/chat/completions
	OpenAICompletions                 // POST /v1/completions
	Anthropic                         // POST /v1/messages
)

// Provider is the value of the event's provider field.
func (p Protocol) Provider() string {
	if p == Anthropic {
		return "anthropic"
	}
	return "openai"
}

// Error codes the meter reports for a stream that went wrong without the upstream saying why.
const (
	CodeMalformed = "malformed_sse"    // a data line that is not the JSON the protocol sends
	CodeTruncated = "stream_truncated" // the stream ended before its terminal event
)

// MaxBody bounds how much of a non-streamed body is kept to read its usage from; a larger
// body still passes through untouched, its tokens are then estimated.
const MaxBody = 8 << 20

// Usage is the token usage a response reported.
type Usage struct {
	Input  int64 // all input tokens, cached ones included
	Output int64
	Cached int64 // input tokens served from the prefix cache
}

// Meter measures one response. Feed it the body as it arrives, then call Result. A Meter is
// not safe for concurrent use; Reset makes it reusable.
type Meter struct {
	proto  Protocol
	stream bool
	strip  bool // drop OpenAI's usage-only chunk: the client did not ask for it
	start  time.Time

	pending []byte // the unfinished SSE event (kept only when stripping) or line
	data    []byte // the data lines of the event being read
	name    []byte // its event: line
	lines   int    // lines of the event being read

	first, last  time.Time
	maxGap       time.Duration
	contentCount int64
	contentBytes int64

	usage     Usage
	haveUsage bool
	done      bool
	errCode   string
	malformed int

	anthropicIn [3]int64 // input, cache read, cache creation as last reported
	inputGuess  int64

	body     []byte
	bodyOver bool

	held *scratch // what pending, data and name came from, given back by Idle
}

// scratch holds a meter's line and event buffers while a stream waits between events.
type scratch struct{ pending, data, name []byte }

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// New returns a meter for a response to a request that started at start.
func New(proto Protocol, stream bool, start time.Time) *Meter {
	m := &Meter{}
	m.Reset(proto, stream, start)
	return m
}

// Reset readies the meter for another response, keeping its buffers.
func (m *Meter) Reset(proto Protocol, stream bool, start time.Time) {
	*m = Meter{proto: proto, stream: stream, start: start,
		pending: m.pending[:0], data: m.data[:0], name: m.name[:0], body: m.body[:0], held: m.held}
}

// Idle lets the line and event buffers go when the meter is between events, so that a stream
// waiting for its next event holds none; Feed takes them back. It is for a stream that may
// wait long: between two reads that follow each other it is only work.
func (m *Meter) Idle() {
	if len(m.pending) > 0 || m.lines > 0 || (m.pending == nil && m.data == nil && m.name == nil) {
		return
	}
	h := m.held
	if h == nil {
		h = new(scratch)
	}
	h.pending, h.data, h.name = m.pending[:0], m.data[:0], m.name[:0]
	m.pending, m.data, m.name, m.held = nil, nil, nil, nil
	scratches.Put(h)
}

// unidle takes buffers back after Idle.
func (m *Meter) unidle() {
	if m.pending != nil || m.data != nil || m.name != nil {
		return
	}
	h := scratches.Get().(*scratch)
	m.pending, m.data, m.name, m.held = h.pending, h.data, h.name, h
}

// StripUsageChunk makes Feed drop OpenAI's final usage-only chunk from what it returns: the
// proxy asked for it on the client's behalf, so the client must not see it.
func (m *Meter) StripUsageChunk() { m.strip = m.proto != Anthropic && m.stream }

// Feed reads the next piece of the body, received at now, and returns what to forward to the
// client: p itself, unless the meter strips the usage chunk, in which case it returns only
// complete SSE events (appended to out) and keeps the rest until it is complete.
func (m *Meter) Feed(p []byte, now time.Time, out []byte) []byte {
	m.unidle()
	if !m.stream {
		if !m.bodyOver {
			if len(m.body)+len(p) > MaxBody {
				m.bodyOver = true
				m.body = m.body[:0]
			} else {
				m.body = append(m.body, p...)
			}
		}
		return p
	}
	if !m.strip {
		m.scan(p, now, nil)
		return p
	}
	return m.scan(p, now, out)
}

// Flush returns what Feed still holds back when the body ends: an unfinished last event is
// measured and forwarded as it is.
func (m *Meter) Flush(now time.Time, out []byte) []byte {
	if !m.stream {
		return out
	}
	rest := m.pending
	if m.strip {
		m.lines, m.data, m.name = 0, m.data[:0], m.name[:0]
		for _, l := range bytes.Split(rest, []byte{'\n'}) {
			if l = bytes.TrimSuffix(l, []byte{'\r'}); len(l) > 0 {
				m.line(l)
			}
		}
		out = append(out, rest...)
	} else if len(rest) > 0 {
		m.line(bytes.TrimSuffix(rest, []byte{'\r'}))
	}
	if m.lines > 0 {
		m.event(now)
	}
	m.pending = m.pending[:0]
	return out
}

// scan splits p into lines and events. When out is not nil (stripping), it returns the
// complete events to forward; otherwise it only measures.
func (m *Meter) scan(p []byte, now time.Time, out []byte) []byte {
	strip := out != nil || m.strip
	if !strip {
		for len(p) > 0 {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				m.pending = append(m.pending, p...)
				return nil
			}
			line := p[:i]
			if len(m.pending) > 0 {
				m.pending = append(m.pending, line...)
				line = m.pending
			}
			m.lineOrEnd(bytes.TrimSuffix(line, []byte{'\r'}), now)
			m.pending = m.pending[:0]
			p = p[i+1:]
		}
		return nil
	}
	// Stripping: keep whole events in pending until their blank line arrives.
	m.pending = append(m.pending, p...)
	buf := m.pending
	evStart, pos := 0, 0
	for {
		i := bytes.IndexByte(buf[pos:], '\n')
		if i < 0 {
			break
		}
		line := bytes.TrimSuffix(buf[pos:pos+i], []byte{'\r'})
		pos += i + 1
		if len(line) > 0 {
			m.line(line)
			continue
		}
		if m.lines == 0 {
			out = append(out, buf[evStart:pos]...)
			evStart = pos
			continue
		}
		if m.event(now) {
			out = append(out, buf[evStart:pos]...)
		}
		evStart = pos
	}
	n := copy(m.pending, buf[evStart:])
	m.pending = m.pending[:n]
	// The half-read event's lines are parsed again when it completes.
	m.lines, m.data, m.name = 0, m.data[:0], m.name[:0]
	if out == nil {
		out = []byte{}
	}
	return out
}

func (m *Meter) lineOrEnd(line []byte, now time.Time) {
	if len(line) == 0 {
		if m.lines > 0 {
			m.event(now)
		}
		return
	}
	m.line(line)
}

func (m *Meter) line(line []byte) {
	m.lines++
	switch {
	case line[0] == ':': // comment, such as OpenRouter's keep-alive
	case bytes.HasPrefix(line, []byte("data:")):
		v := bytes.TrimPrefix(line[5:], []byte{' '})
		if len(m.data) > 0 {
			m.data = append(m.data, '\n')
		}
		m.data = append(m.data, v...)
	case bytes.HasPrefix(line, []byte("event:")):
		m.name = append(m.name[:0], bytes.TrimPrefix(line[6:], []byte{' '})...)
	}
}

// event handles the event whose lines were just read and reports whether to forward it.
func (m *Meter) event(now time.Time) (keep bool) {
	keep = true
	data, name := m.data, m.name
	if len(data) > 0 {
		if m.proto == Anthropic {
			m.anthropicEvent(name, data, now)
		} else {
			keep = m.openAIEvent(data, now)
		}
	}
	m.lines, m.data, m.name = 0, m.data[:0], m.name[:0]
	return keep
}

func (m *Meter) content(now time.Time, n int) {
	if m.contentCount == 0 {
		m.first = now
	} else if gap := now.Sub(m.last); gap > m.maxGap {
		m.maxGap = gap
	}
	m.last = now
	m.contentCount++
	m.contentBytes += int64(n)
}

type openAIUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *openAIUsage) usage() Usage {
	out := Usage{Input: u.PromptTokens, Output: u.CompletionTokens}
	if u.PromptTokensDetails != nil {
		out.Cached = u.PromptTokensDetails.CachedTokens
	}
	return out
}

type providerError struct {
	Type string          `json:"type"`
	Code json.RawMessage `json:"code"`
}

func (e *providerError) code() string {
	code := e.Type
	if code == "" && len(e.Code) > 0 && string(e.Code) != "null" {
		code = string(bytes.Trim(e.Code, `"`))
	}
	if code == "" {
		code = "upstream_error"
	}
	if len(code) > 64 {
		code = code[:64]
	}
	return code
}

type openAIChunk struct {
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			Refusal          string          `json:"refusal"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
			FunctionCall     json.RawMessage `json:"function_call"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *openAIUsage   `json:"usage"`
	Error *providerError `json:"error"`
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null" && string(raw) != "[]"
}

func (m *Meter) openAIEvent(data []byte, now time.Time) (keep bool) {
	if bytes.Equal(data, []byte("[DONE]")) {
		m.done = true
		return true
	}
	if n, ok := openAIFast(data); ok {
		if n > 0 {
			m.content(now, n)
		}
		return true
	}
	var c openAIChunk
	if err := json.Unmarshal(data, &c); err != nil {
		m.malformed++
		return true
	}
	return m.slowOpenAIEvent(&c, now)
}

// slowOpenAIEvent measures a decoded chunk and reports whether to forward it.
func (m *Meter) slowOpenAIEvent(c *openAIChunk, now time.Time) (keep bool) {
	if c.Error != nil {
		m.errCode = c.Error.code()
	}
	n := 0
	for i := range c.Choices {
		ch := &c.Choices[i]
		n += len(ch.Delta.Content) + len(ch.Delta.ReasoningContent) + len(ch.Delta.Reasoning) + len(ch.Delta.Refusal) + len(ch.Text)
		if present(ch.Delta.ToolCalls) || present(ch.Delta.FunctionCall) {
			n += max(len(ch.Delta.ToolCalls)+len(ch.Delta.FunctionCall), 1)
		}
	}
	if n > 0 {
		m.content(now, n)
	}
	if c.Usage != nil {
		m.usage, m.haveUsage = c.Usage.usage(), true
		if m.strip && len(c.Choices) == 0 {
			return false
		}
	}
	return true
}

type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
}

// merge applies a usage report; message_delta's counts are cumulative and may omit fields.
func (m *Meter) mergeAnthropic(u *anthropicUsage) {
	m.haveUsage = true
	in, read, create := m.anthropicIn[0], m.anthropicIn[1], m.anthropicIn[2]
	if u.InputTokens != nil {
		in = *u.InputTokens
	}
	if u.CacheReadInputTokens != nil {
		read = *u.CacheReadInputTokens
	}
	if u.CacheCreationInputTokens != nil {
		create = *u.CacheCreationInputTokens
	}
	m.anthropicIn = [3]int64{in, read, create}
	// Anthropic's input_tokens leaves out the cached and cache-writing tokens.
	m.usage.Input = in + read + create
	m.usage.Cached = read
	if u.OutputTokens != nil {
		m.usage.Output = *u.OutputTokens
	}
}

type anthropicEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Delta *struct {
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		Thinking    string `json:"thinking"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *providerError  `json:"error"`
}

func (m *Meter) anthropicEvent(name, data []byte, now time.Time) {
	// The frequent events need no decoding: a delta is content whatever it holds.
	if wellFormed(data) {
		switch string(name) {
		case "content_block_delta":
			m.content(now, len(data))
			return
		case "ping", "content_block_start", "content_block_stop":
			return
		}
	}
	var e anthropicEvent
	if err := json.Unmarshal(data, &e); err != nil {
		m.malformed++
		return
	}
	typ := e.Type
	if typ == "" {
		typ = string(name)
	}
	switch typ {
	case "message_start":
		if e.Message != nil && e.Message.Usage != nil {
			m.mergeAnthropic(e.Message.Usage)
		}
	case "content_block_delta":
		n := 1
		if e.Delta != nil {
			n = max(len(e.Delta.Text)+len(e.Delta.PartialJSON)+len(e.Delta.Thinking), 1)
		}
		m.content(now, n)
	case "message_delta":
		if e.Usage != nil {
			m.mergeAnthropic(e.Usage)
		}
	case "message_stop":
		m.done = true
	case "error":
		if e.Error != nil {
			m.errCode = e.Error.code()
		} else {
			m.errCode = "upstream_error"
		}
	}
}

// Stripping reports whether Feed drops the usage chunk.
func (m *Meter) Stripping() bool { return m.strip }
