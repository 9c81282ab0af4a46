package meter

import (
	"bytes"
	"encoding/json"
	"strings"
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
	OpenAIResponses                   // POST /v1/responses
)

// Provider is the value of the event's provider field.
func (p Protocol) Provider() string {
	if p == Anthropic {
		return "anthropic"
	}
	return "openai"
}

// IsEventStream reports whether a Content-Type is text/event-stream, in any case and with
// any parameters (a media type is case-insensitive, RFC 9110, 8.3.1).
func IsEventStream(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// Error codes the meter reports for a stream that went wrong without the upstream saying why.
const (
	CodeMalformed = "malformed_sse"    // a data line that is not the JSON the protocol sends
	CodeTruncated = "stream_truncated" // the stream ended before its terminal event
	// CodeOverflow: an SSE event longer than the meter's limit, or a body longer than
	// MaxBody, passed to the client unread (a Responses event is read as it passes).
	CodeOverflow = "meter_overflow"
)

// MaxBody bounds how much of a non-streamed body is kept to read its usage from; a larger
// body still passes through untouched, unread (CodeOverflow).
const MaxBody = 8 << 20

// DefaultMaxEvent is the longest SSE event, its lines up to the blank line that ends it,
// that the meter holds when SetMaxEvent was not called. A longer one passes through as it
// comes, unread, and marks the response with CodeOverflow; a Responses event is read as it
// passes.
const DefaultMaxEvent = 1 << 20

// keepCap is the largest buffer the meter keeps for the next event or stream: one that grew
// past it for a long event is let go.
const keepCap = 64 << 10

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
	max    int // the longest event read; 0: DefaultMaxEvent

	// Stripping, pending holds the event being read, held back until its blank line, and
	// lineAt is where its unfinished line starts; otherwise pending holds the unfinished
	// line only, and evBytes counts the event's lines before it.
	pending []byte
	lineAt  int
	evBytes int
	data    []byte // the data lines of the event being read
	name    []byte // its event: line
	lines   int    // lines of the event being read

	// An event over the limit is passed over up to its blank line: skipping says whether
	// the line being passed over has any bytes yet.
	skip      bool
	skipping  bool
	overflows int
	unread    int // of them, those whose passing unread leaves the measure in doubt

	// A Responses event past the limit is read as it passes (responses_big.go).
	big   *bigEvent
	bigOn bool

	// A line may end with CR, LF or CRLF (the SSE format): crLF is set when a CR ended the
	// last piece, so that an LF starting the next belongs to it, and says where that LF goes.
	crLF crFollow

	first, last  time.Time
	maxGap       time.Duration
	contentCount int64
	contentBytes int64

	usage     Usage
	haveUsage bool
	inKnown   bool // the usage reported counts the input: an absent count is not a zero
	outKnown  bool // and the output (OpenAI's; Anthropic's is finalOut)
	finalOut  bool // Anthropic: the output count is the final one (message_delta, or a body)
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

// Reset readies the meter for another response, keeping its buffers (those not grown large).
func (m *Meter) Reset(proto Protocol, stream bool, start time.Time) {
	*m = Meter{proto: proto, stream: stream, start: start,
		pending: kept(m.pending), data: kept(m.data), name: kept(m.name), body: kept(m.body), held: m.held, big: m.big}
}

// SetMaxEvent sets the longest SSE event the meter reads, n bytes with its lines' ends (at
// least 1 KiB; 0 for DefaultMaxEvent). What the meter holds of a stream is bounded by about
// twice that.
func (m *Meter) SetMaxEvent(n int) {
	if n > 0 {
		n = max(n, 1<<10)
	}
	m.max = n
}

func (m *Meter) maxEvent() int {
	if m.max > 0 {
		return m.max
	}
	return DefaultMaxEvent
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
	h.pending, h.data, h.name = kept(m.pending), kept(m.data), kept(m.name)
	m.pending, m.data, m.name, m.held = nil, nil, nil, nil
	scratches.Put(h)
}

// kept returns b emptied, or nil if it grew too large to keep.
func kept(b []byte) []byte {
	if cap(b) > keepCap {
		return nil
	}
	return b[:0]
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
func (m *Meter) StripUsageChunk() {
	m.strip = (m.proto == OpenAIChat || m.proto == OpenAICompletions) && m.stream
}

// Feed reads the next piece of the body, received at now, and returns what to forward to the
// client: p itself, unless the meter strips the usage chunk, in which case it returns only
// complete SSE events (appended to out) and keeps the rest until it is complete. An event
// longer than the limit (SetMaxEvent) is not kept: what came of it is returned, and the rest
// as it comes.
func (m *Meter) Feed(p []byte, now time.Time, out []byte) []byte {
	m.unidle()
	if !m.stream {
		if !m.bodyOver {
			if len(m.body)+len(p) > MaxBody {
				m.bodyOver = true
				m.body = kept(m.body)
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
	out = m.scan(p, now, out)
	if out == nil {
		out = []byte{}
	}
	return out
}

// Flush returns what Feed still holds back when the body ends: an unfinished last event is
// measured and forwarded as it is.
func (m *Meter) Flush(now time.Time, out []byte) []byte {
	if !m.stream {
		return out
	}
	if m.skip {
		m.skip, m.skipping = false, false // the event past the limit ended with the body
		if m.bigOn {
			m.big.endLine()
			m.bigEnd(now)
		}
	}
	m.crLF = crNone
	if rest := bytes.TrimSuffix(m.pending[m.lineAt:], []byte{'\r'}); len(rest) > 0 {
		m.line(rest)
	}
	if m.strip {
		out = append(out, m.pending...)
	}
	if m.lines > 0 {
		m.event(now)
	}
	m.pending, m.lineAt, m.evBytes = m.pending[:0], 0, 0
	return out
}

// size is how long the event being read is so far.
func (m *Meter) size() int {
	if m.strip {
		return len(m.pending)
	}
	return m.evBytes + len(m.pending)
}

// crFollow is where the LF after a CR that ended the last piece goes, if it comes: it ends
// the same line.
type crFollow uint8

const (
	crNone crFollow = iota // the last piece did not end with a CR
	crHeld                 // into the event held back (stripping) or counted (not)
	crOut                  // forwarded, as the CR was (stripping)
	crDrop                 // dropped, as the CR was (the usage chunk; or not stripping)
)

// lineEnd finds the first line end in p, CR, LF or CRLF, and returns where it starts and
// how long it is; -1 when p holds none.
func lineEnd(p []byte) (at, n int) {
	lf := bytes.IndexByte(p, '\n')
	head := p
	if lf >= 0 {
		head = p[:lf]
	}
	if cr := bytes.IndexByte(head, '\r'); cr >= 0 {
		if cr+1 == lf {
			return cr, 2
		}
		return cr, 1
	}
	if lf < 0 {
		return -1, 0
	}
	return lf, 1
}

// scan splits p into lines and events. Stripping, it appends to out the complete events to
// forward and returns it; otherwise it only measures.
func (m *Meter) scan(p []byte, now time.Time, out []byte) []byte {
	if m.crLF != crNone && len(p) > 0 {
		to := m.crLF
		m.crLF = crNone
		if p[0] == '\n' {
			// The LF of a CRLF cut after its CR: it ends the line the CR ended.
			p = p[1:]
			switch {
			case to == crHeld && m.size()+1 > m.maxEvent():
				out = m.overflow(lf, true, out)
			case to == crHeld && m.strip:
				m.pending = append(m.pending, '\n')
				m.lineAt = len(m.pending)
			case to == crHeld:
				m.evBytes++
			case to == crOut:
				out = append(out, '\n')
			}
		}
	}
	for len(p) > 0 {
		if m.skip {
			n := m.skipEvent(p, now)
			if m.strip {
				out = append(out, p[:n]...)
			}
			p = p[n:]
			continue
		}
		i, k := lineEnd(p)
		if i < 0 {
			// An unfinished line.
			if m.size()+len(p) > m.maxEvent() {
				return m.overflow(p, false, out)
			}
			m.pending = append(m.pending, p...)
			return out
		}
		piece := p[:i+k]
		p = p[i+k:]
		cut := len(p) == 0 && piece[i] == '\r' && k == 1 // an LF may come next
		blank := len(m.pending)-m.lineAt+i == 0
		if !blank && m.size()+len(piece) > m.maxEvent() {
			out = m.overflow(piece, true, out)
			if cut {
				m.crLF = crOut
			}
			continue
		}
		if cut {
			m.crLF = crHeld
		}
		if m.strip {
			m.pending = append(m.pending, piece...)
			if !blank {
				m.line(m.pending[m.lineAt : len(m.pending)-k])
				m.lineAt = len(m.pending)
				continue
			}
			if m.lines == 0 || m.event(now) {
				out = append(out, m.pending...)
				if cut {
					m.crLF = crOut
				}
			} else if cut {
				m.crLF = crDrop
			}
			m.pending, m.lineAt = m.pending[:0], 0
			continue
		}
		line := piece[:i]
		if len(m.pending) > 0 {
			m.pending = append(m.pending, line...)
			line = m.pending
		}
		if blank {
			if m.lines > 0 {
				m.event(now)
			}
			m.evBytes = 0
			if cut {
				m.crLF = crDrop
			}
		} else {
			m.line(line)
			m.evBytes += len(line) + k
		}
		m.pending = m.pending[:0]
	}
	return out
}

var lf = []byte{'\n'}

// overflow gives up the event being read, which piece would take past the limit: what is
// held of it is forwarded (stripping), and the rest of it is passed over as it comes. piece
// ends a line when complete is set.
//
// A Responses event is read as it passes (bigStart): its kind of event needs no more than a
// few members of it. Another is not read, and the measure is in doubt.
func (m *Meter) overflow(piece []byte, complete bool, out []byte) []byte {
	m.overflows++
	if m.proto == OpenAIResponses {
		m.bigStart(piece, complete)
	} else {
		m.unread++
	}
	m.skip, m.skipping = true, !complete && len(m.pending)-m.lineAt+len(piece) > 0
	if m.strip {
		out = append(out, m.pending...)
		out = append(out, piece...)
	}
	m.pending, m.lineAt, m.evBytes = kept(m.pending), 0, 0
	m.lines, m.data, m.name = 0, kept(m.data), kept(m.name)
	return out
}

// skipEvent passes over the event past the limit up to the blank line that ends it, and
// returns how much of p that took. A Responses event is read as it passes.
func (m *Meter) skipEvent(p []byte, now time.Time) int {
	pos := 0
	for {
		i, k := lineEnd(p[pos:])
		if i < 0 {
			m.skipping = m.skipping || pos < len(p)
			if m.bigOn {
				m.big.line(p[pos:])
			}
			return len(p)
		}
		blank := i == 0 && !m.skipping
		m.skipping = false
		if m.bigOn && !blank {
			m.big.line(p[pos : pos+i])
			m.big.endLine()
		}
		pos += i + k
		if pos == len(p) && k == 1 && p[pos-1] == '\r' {
			m.crLF = crOut // its LF, if it comes, goes the same way
		}
		if blank {
			m.skip = false
			if m.bigOn {
				m.bigEnd(now)
			}
			return pos
		}
	}
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
		switch m.proto {
		case Anthropic:
			m.anthropicEvent(name, data, now)
		case OpenAIResponses:
			m.responsesEvent(name, data, now)
		default:
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

// reported is a usage report, and which of its counts it holds.
type reported struct {
	Usage
	in, out bool
}

// setUsage applies an OpenAI usage report, the last one winning.
func (m *Meter) setUsage(u *reported) {
	m.usage, m.haveUsage, m.inKnown, m.outKnown = u.Usage, true, u.in, u.out
}

// openAIUsage reads OpenAI's usage object; nil for null.
func openAIUsage(v []byte) (u *reported, ok bool) {
	return usageObject(v, "prompt_tokens", "completion_tokens", "prompt_tokens_details")
}

// usageObject reads a usage object of an OpenAI API, whose input, output and input details
// (holding cached_tokens) members are named in, out and details; nil for null.
func usageObject(v []byte, in, out, details string) (u *reported, ok bool) {
	if isNull(v) {
		return nil, true
	}
	var inN, outN, cached *int64
	ok = object(v, func(name, v []byte) (ok bool) {
		switch string(name) {
		case in:
			inN, ok = count(v)
		case out:
			outN, ok = count(v)
		case details:
			cached = nil
			ok = object(v, func(name, v []byte) (ok bool) {
				if string(name) != "cached_tokens" {
					return true
				}
				cached, ok = count(v)
				return ok
			})
		default:
			ok = true
		}
		return ok
	})
	if !ok {
		return nil, false
	}
	return newReported(inN, outN, cached), true
}

// newReported is the usage of the counts given, those absent not known.
func newReported(in, out, cached *int64) *reported {
	u := &reported{in: in != nil, out: out != nil}
	for _, f := range [...]struct {
		dst *int64
		src *int64
	}{{&u.Input, in}, {&u.Output, out}, {&u.Cached, cached}} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	return u
}

// providerError is an error object in a stream or body.
type providerError struct{ typ, code string }

// readError reads a provider's error object; nil for null.
func readError(v []byte) (e *providerError, ok bool) {
	if isNull(v) {
		return nil, true
	}
	e = &providerError{}
	ok = object(v, func(name, v []byte) bool { return e.read(string(name), v) })
	return e, ok
}

// read reads one member of an error object: its type (TGI's error_type) and its code, a
// string or a number (the other types say nothing).
func (e *providerError) read(name string, v []byte) (ok bool) {
	switch name {
	case "type", "error_type":
		if s, isText := text(v); isText {
			e.typ = s
		}
	case "code":
		e.code = ""
		if s, isText := text(v); isText {
			e.code = s
		} else if len(v) > 0 && (v[0] == '-' || ('0' <= v[0] && v[0] <= '9')) {
			e.code = string(v)
		}
	}
	return true
}

func (e *providerError) String() string {
	code := e.typ
	if code == "" {
		code = e.code
	}
	if code == "" {
		code = "upstream_error"
	}
	if len(code) > 64 {
		code = code[:64]
	}
	return code
}

// openAIChunk is what the meter reads of an OpenAI chunk.
type openAIChunk struct {
	content int // bytes of content in its choices
	choices int
	usage   *reported
	err     *providerError
}

// readOpenAIChunk reads a chunk's data; ok is false when it is not the JSON OpenAI sends.
// Besides OpenAI's {"error":{…}}, the error chunks of OpenAI-compatible servers are errors
// too: vLLM's and SGLang's {"object":"error","type":…,"code":…} (followed by [DONE]) and
// TGI's {"error":"…","error_type":…}.
func readOpenAIChunk(data []byte) (c openAIChunk, ok bool) {
	if !json.Valid(data) {
		return c, false
	}
	var flat providerError // the chunk's own type and code, or TGI's error_type
	isError, errText := false, false
	ok = object(data, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "choices":
			c.content, c.choices = 0, 0
			return array(v, func(ch []byte) bool {
				c.choices++
				n, ok := choiceContent(ch, "delta")
				c.content += n
				return ok
			})
		case "usage":
			c.usage, ok = openAIUsage(v)
		case "error":
			c.err, errText = nil, false
			if v[0] == '"' {
				// TGI's; an empty one is no error, as the SDKs raise only on a truthy one.
				errText, ok = string(v) != `""`, true
			} else {
				c.err, ok = readError(v)
			}
		case "object":
			// Only the string "error" says anything: another object is no reason to doubt the chunk.
			s, isText := text(v)
			isError, ok = isText && s == "error", true
		case "type", "code", "error_type":
			ok = flat.read(string(name), v)
		default:
			ok = true
		}
		return ok
	})
	if ok && c.err == nil && (isError || errText) {
		c.err = &flat
	}
	return c, ok
}

// choiceContent is the content of one choice of a chunk (its delta) or of a body (its message):
// text, reasoning, refusal, audio (its transcript, and 1 for its data: gpt-4o's audio output)
// and tool calls, in bytes.
func choiceContent(ch []byte, msg string) (n int, ok bool) {
	var texts [7]int // content, reasoning_content, reasoning, refusal, the choice's text, audio transcript and data
	var tools, fn []byte
	ok = object(ch, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "text":
			texts[4], ok = textLen(v)
		case msg:
			texts[0], texts[1], texts[2], texts[3], texts[5], texts[6], tools, fn = 0, 0, 0, 0, 0, 0, nil, nil
			ok = object(v, func(name, v []byte) (ok bool) {
				switch string(name) {
				case "content":
					texts[0], ok = textLen(v)
				case "reasoning_content":
					texts[1], ok = textLen(v)
				case "reasoning":
					texts[2], ok = textLen(v)
				case "refusal":
					texts[3], ok = textLen(v)
				case "audio":
					texts[5], texts[6] = 0, 0
					ok = object(v, func(name, v []byte) (ok bool) {
						switch string(name) {
						case "transcript":
							texts[5], ok = textLen(v)
						case "data":
							// The audio's base64 says the answer has begun, not how long it is.
							texts[6], ok = textLen(v)
							texts[6] = min(texts[6], 1)
						default:
							ok = true
						}
						return ok
					})
				case "tool_calls":
					tools, ok = v, true
				case "function_call":
					fn, ok = v, true
				default:
					ok = true
				}
				return ok
			})
		default:
			ok = true
		}
		return ok
	})
	for _, t := range texts {
		n += t
	}
	if present(tools) || present(fn) {
		n += max(len(tools)+len(fn), 1)
	}
	return n, ok
}

func present(raw []byte) bool {
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
	c, ok := readOpenAIChunk(data)
	if !ok {
		m.malformed++
		return true
	}
	return m.slowOpenAIEvent(&c, now)
}

// slowOpenAIEvent measures a decoded chunk and reports whether to forward it.
func (m *Meter) slowOpenAIEvent(c *openAIChunk, now time.Time) (keep bool) {
	if c.err != nil {
		m.errCode = c.err.String()
	}
	if c.content > 0 {
		m.content(now, c.content)
	}
	if c.usage != nil {
		m.setUsage(c.usage)
		if m.strip && c.choices == 0 {
			return false
		}
	}
	return true
}

type anthropicUsage struct {
	InputTokens              *int64
	OutputTokens             *int64
	CacheReadInputTokens     *int64
	CacheCreationInputTokens *int64
}

// readAnthropicUsage reads Anthropic's usage object; nil for null.
func readAnthropicUsage(v []byte) (u *anthropicUsage, ok bool) {
	if isNull(v) {
		return nil, true
	}
	u = &anthropicUsage{}
	ok = object(v, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "input_tokens":
			u.InputTokens, ok = count(v)
		case "output_tokens":
			u.OutputTokens, ok = count(v)
		case "cache_read_input_tokens":
			u.CacheReadInputTokens, ok = count(v)
		case "cache_creation_input_tokens":
			u.CacheCreationInputTokens, ok = count(v)
		default:
			ok = true
		}
		return ok
	})
	return u, ok
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
	m.inKnown = m.inKnown || u.InputTokens != nil
	// Anthropic's input_tokens leaves out the cached and cache-writing tokens.
	m.usage.Input = in + read + create
	m.usage.Cached = read
	if u.OutputTokens != nil {
		m.usage.Output = *u.OutputTokens
	}
}

// anthropicEvent is what the meter reads of an Anthropic stream event.
type anthropicEvent struct {
	typ          string
	messageUsage *anthropicUsage // message_start's message.usage
	delta        int             // bytes of a content_block_delta's delta
	hasDelta     bool
	usage        *anthropicUsage // message_delta's
	err          *providerError
}

func readAnthropicEvent(data []byte) (e anthropicEvent, ok bool) {
	if !json.Valid(data) {
		return e, false
	}
	ok = object(data, func(name, v []byte) (ok bool) {
		switch string(name) {
		case "type":
			e.typ, ok = text(v)
		case "message":
			e.messageUsage = nil
			ok = object(v, func(name, v []byte) (ok bool) {
				if string(name) != "usage" {
					return true
				}
				e.messageUsage, ok = readAnthropicUsage(v)
				return ok
			})
		case "delta":
			var parts [3]int // text, partial_json, thinking
			e.hasDelta = !isNull(v)
			ok = object(v, func(name, v []byte) (ok bool) {
				switch string(name) {
				case "text":
					parts[0], ok = textLen(v)
				case "partial_json":
					parts[1], ok = textLen(v)
				case "thinking":
					parts[2], ok = textLen(v)
				default:
					ok = true
				}
				return ok
			})
			e.delta = parts[0] + parts[1] + parts[2]
		case "usage":
			e.usage, ok = readAnthropicUsage(v)
		case "error":
			e.err, ok = readError(v)
		default:
			ok = true
		}
		return ok
	})
	return e, ok
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
	e, ok := readAnthropicEvent(data)
	if !ok {
		m.malformed++
		return
	}
	typ := e.typ
	if typ == "" {
		typ = string(name)
	}
	switch typ {
	case "message_start":
		if e.messageUsage != nil {
			// Its output_tokens is a placeholder (1): the count comes with message_delta.
			m.mergeAnthropic(e.messageUsage)
		}
	case "content_block_delta":
		n := 1
		if e.hasDelta {
			n = max(e.delta, 1)
		}
		m.content(now, n)
	case "message_delta":
		if e.usage != nil {
			m.mergeAnthropic(e.usage)
			m.finalOut = m.finalOut || e.usage.OutputTokens != nil
		}
	case "message_stop":
		m.done = true
	case "error":
		if e.err != nil {
			m.errCode = e.err.String()
		} else {
			m.errCode = "upstream_error"
		}
	}
}

// Stripping reports whether Feed drops the usage chunk.
func (m *Meter) Stripping() bool { return m.strip }
