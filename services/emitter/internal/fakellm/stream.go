package fakellm

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// sseWriter writes events and flushes each one, through gzip when asked.
type sseWriter struct {
	rc  *http.ResponseController
	w   io.Writer
	zw  *gzip.Writer
	buf []byte
	err error
}

func (s *sseWriter) send(b []byte) bool {
	if s.err != nil {
		return false
	}
	if _, s.err = s.w.Write(b); s.err != nil {
		return false
	}
	if s.zw != nil {
		if s.err = s.zw.Flush(); s.err != nil {
			return false
		}
	}
	s.err = s.rc.Flush()
	return s.err == nil
}

func (s *sseWriter) data(format string, args ...any) bool {
	s.buf = append(s.buf[:0], "data: "...)
	s.buf = fmt.Appendf(s.buf, format, args...)
	s.buf = append(s.buf, "\n\n"...)
	return s.send(s.buf)
}

func (s *sseWriter) event(name, format string, args ...any) bool {
	s.buf = append(s.buf[:0], "event: "...)
	s.buf = append(s.buf, name...)
	s.buf = append(s.buf, "\ndata: "...)
	s.buf = fmt.Appendf(s.buf, format, args...)
	s.buf = append(s.buf, "\n\n"...)
	return s.send(s.buf)
}

// streamOut streams p, through the scheduler when sq is not nil, and reports whether it
// sent every token.
func (s *Server) streamOut(w http.ResponseWriter, r *http.Request, p *plan, sq *seq) bool {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	sw := &sseWriter{rc: http.NewResponseController(w), w: w}
	if p.mode == ModeGzip {
		h.Set("Content-Encoding", "gzip")
		sw.zw = gzip.NewWriter(w)
		sw.w = sw.zw
		defer sw.zw.Close()
	}
	w.WriteHeader(http.StatusOK)
	// As vLLM and the providers do, the opening events (role, message_start) go out at once
	// and the first token only after prefill: a proxy timing the first byte gets TTFT wrong.
	pace := newPacer(r)
	defer pace.stop()
	if !s.open(sw, p) {
		return false
	}
	if sq == nil && !pace.sleep(p.ttft-p.ttft/2) || sq != nil && !s.admit(r.Context(), sq, p, pace.sleep) {
		return false
	}
	te := newTokenEvent(p)
	cut := p.output / 2
	for i := range p.output {
		if i > 0 && !pace.sleep(p.tpot) {
			return false
		}
		if sq != nil && !s.step(r.Context(), sq, p, pace.sleep) {
			return false
		}
		if i == cut && i > 0 {
			switch p.mode {
			case ModeStall:
				<-r.Context().Done()
				return false
			case ModeDisconnect:
				if conn, _, err := sw.rc.Hijack(); err == nil {
					_ = conn.Close()
				}
				return false
			case ModeSSEError:
				s.sseError(sw, p)
				return false
			case ModeMalformed:
				if !sw.send([]byte("data: {\"choices\": [oops\n\n")) {
					return false
				}
			}
		}
		if !s.token(sw, p, &te, i) {
			return false
		}
	}
	s.close(sw, p)
	return true
}

func (s *Server) open(sw *sseWriter, p *plan) bool {
	switch p.api {
	case chat:
		return sw.data(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"system_fingerprint":"fp_fake","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`,
			p.id, p.created, p.model)
	case completions:
		return sw.send(nil)
	case messages:
		return sw.event("message_start", `{"type":"message_start","message":{"id":%q,"type":"message","role":"assistant","model":%q,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":0,"cache_read_input_tokens":%d,"output_tokens":1}}}`,
			p.id, p.model, p.input-p.cached, p.cached) &&
			sw.event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`) &&
			sw.event("ping", `{"type": "ping"}`)
	case responses:
		item := "msg_" + p.id[len("resp_"):]
		return sw.event("response.created", `{"type":"response.created","sequence_number":0,"response":%s}`, p.responseObject("in_progress", "")) &&
			sw.event("response.in_progress", `{"type":"response.in_progress","sequence_number":1,"response":%s}`, p.responseObject("in_progress", "")) &&
			sw.event("response.output_item.added", `{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"id":%q,"type":"message","status":"in_progress","content":[],"role":"assistant"}}`, item) &&
			sw.event("response.content_part.added", `{"type":"response.content_part.added","sequence_number":3,"item_id":%q,"output_index":0,"content_index":0,"part":{"type":"output_text","annotations":[],"logprobs":[],"text":""}}`, item)
	}
	return true
}

// responsesOpening is how many events a Responses stream sends before its first delta.
const responsesOpening = 4

// tokenEvent is the bytes of one token's event around its quoted word, made once per
// stream: the fake serves thousands of tokens a second in the benchmarks, next to the proxy
// they measure, so it must cost little.
type tokenEvent struct{ before, after []byte }

func newTokenEvent(p *plan) tokenEvent {
	q := func(s string) string { return strconv.Quote(s) }
	switch p.api {
	case chat:
		return tokenEvent{[]byte(`data: {"id":` + q(p.id) + `,"object":"chat.completion.chunk","created":` + strconv.FormatInt(p.created, 10) +
			`,"model":` + q(p.model) + `,"system_fingerprint":"fp_fake","choices":[{"index":0,"delta":{"content":`),
			[]byte("},\"logprobs\":null,\"finish_reason\":null}]}\n\n")}
	case completions:
		return tokenEvent{[]byte(`data: {"id":` + q(p.id) + `,"object":"text_completion","created":` + strconv.FormatInt(p.created, 10) + `,"choices":[{"text":`),
			[]byte(`,"index":0,"logprobs":null,"finish_reason":null}],"model":` + q(p.model) + "}\n\n")}
	case responses:
		return tokenEvent{[]byte(`event: response.output_text.delta` + "\n" + `data: {"type":"response.output_text.delta","item_id":"msg_` + p.id[len("resp_"):] +
			`","output_index":0,"content_index":0,"delta":`), []byte(`,"logprobs":[],"sequence_number":`)}
	default:
		return tokenEvent{[]byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"),
			[]byte("}}\n\n")}
	}
}

func (s *Server) token(sw *sseWriter, p *plan, te *tokenEvent, i int) bool {
	sw.buf = append(sw.buf[:0], te.before...)
	sw.buf = strconv.AppendQuote(sw.buf, p.word(i))
	sw.buf = append(sw.buf, te.after...)
	if p.api == responses {
		sw.buf = strconv.AppendInt(sw.buf, int64(responsesOpening+i), 10)
		sw.buf = append(sw.buf, "}\n\n"...)
	}
	return sw.send(sw.buf)
}

func (s *Server) close(sw *sseWriter, p *plan) {
	switch p.api {
	case chat:
		if !sw.data(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"system_fingerprint":"fp_fake","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":%q}]}`,
			p.id, p.created, p.model, p.finishReason()) {
			return
		}
		if p.includeUsage && !sw.data(`{"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"system_fingerprint":"fp_fake","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			p.id, p.created, p.model, p.input, p.output, p.input+p.output, p.cached) {
			return
		}
		sw.data("[DONE]")
	case completions:
		if !sw.data(`{"id":%q,"object":"text_completion","created":%d,"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":%q}],"model":%q}`,
			p.id, p.created, p.finishReason(), p.model) {
			return
		}
		if p.includeUsage && !sw.data(`{"id":%q,"object":"text_completion","created":%d,"choices":[],"model":%q,"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			p.id, p.created, p.model, p.input, p.output, p.input+p.output) {
			return
		}
		sw.data("[DONE]")
	case messages:
		_ = sw.event("content_block_stop", `{"type":"content_block_stop","index":0}`) &&
			sw.event("message_delta", `{"type":"message_delta","delta":{"stop_reason":%q,"stop_sequence":null},"usage":{"output_tokens":%d}}`, p.stopReason(), p.output) &&
			sw.event("message_stop", `{"type":"message_stop"}`)
	case responses:
		item, text, seq := "msg_"+p.id[len("resp_"):], p.text(p.output), responsesOpening+p.output
		part := fmt.Sprintf(`{"type":"output_text","annotations":[],"logprobs":[],"text":%q}`, text)
		_ = sw.event("response.output_text.done", `{"type":"response.output_text.done","sequence_number":%d,"item_id":%q,"output_index":0,"content_index":0,"text":%q,"logprobs":[]}`, seq, item, text) &&
			sw.event("response.content_part.done", `{"type":"response.content_part.done","sequence_number":%d,"item_id":%q,"output_index":0,"content_index":0,"part":%s}`, seq+1, item, part) &&
			sw.event("response.output_item.done", `{"type":"response.output_item.done","sequence_number":%d,"output_index":0,"item":{"id":%q,"type":"message","status":"completed","content":[%s],"role":"assistant"}}`, seq+2, item, part) &&
			sw.event("response."+p.status(), `{"type":"response.%s","sequence_number":%d,"response":%s}`, p.status(), seq+3, p.responseObject(p.status(), text))
	}
}

func (s *Server) sseError(sw *sseWriter, p *plan) {
	switch p.api {
	case messages:
		sw.event("error", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
		return
	case responses:
		sw.event("error", `{"type":"error","code":"server_error","message":"The server had an error while processing your request.","param":null,"sequence_number":%d}`, responsesOpening+p.output/2)
		return
	}
	sw.data(`{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`)
}

// pacer sleeps between a stream's events on one timer, and wakes when the client leaves.
type pacer struct {
	r *http.Request
	t *time.Timer
}

func newPacer(r *http.Request) *pacer { return &pacer{r: r} }

func (p *pacer) sleep(d time.Duration) bool {
	if d <= 0 {
		return p.r.Context().Err() == nil
	}
	if p.t == nil {
		p.t = time.NewTimer(d)
	} else {
		p.t.Reset(d)
	}
	select {
	case <-p.t.C:
		return true
	case <-p.r.Context().Done():
		return false
	}
}

func (p *pacer) stop() {
	if p.t != nil {
		p.t.Stop()
	}
}
