package meter

import (
	"strings"
	"testing"
	"time"
)

// TestChatAudioDelta: a chat stream with audio output (gpt-4o's) sends its answer in
// choices[].delta.audio, its transcript and its base64 data: that is content, for the time
// to the first token and for the answer having begun. A chunk with only the audio's id or
// its expiry is not.
func TestChatAudioDelta(t *testing.T) {
	chunks := []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"refusal":null}}]}`,
		`{"choices":[{"index":0,"delta":{"audio":{"id":"audio_1"}}}]}`,
		`{"choices":[{"index":0,"delta":{"audio":{"transcript":"Hel"}}}]}`,
		`{"choices":[{"index":0,"delta":{"audio":{"data":"UklGRnoGAABXQVZF"}}}]}`,
		`{"choices":[{"index":0,"delta":{"audio":{"expires_at":1729234747}}}]}`,
		`{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":17,"completion_tokens":51}}`,
		`[DONE]`,
	}
	m := New(OpenAIChat, true, t0)
	for i, c := range chunks {
		m.Feed([]byte("data: "+c+"\n\n"), t0.Add(time.Duration(i+1)*time.Millisecond), nil)
		if begun, want := m.Begun(), i >= 2; begun != want {
			t.Fatalf("after chunk %d begun %v, want %v", i, begun, want)
		}
	}
	m.Flush(t0.Add(time.Second), nil)
	r := m.Result(t0.Add(time.Second))
	if r.ContentEvents != 2 || r.TTFT != 3*time.Millisecond || r.Total != 4*time.Millisecond || r.Malformed != 0 {
		t.Fatalf("content events %d TTFT %v total %v malformed %d, want 2, 3ms, 4ms, 0", r.ContentEvents, r.TTFT, r.Total, r.Malformed)
	}
}

// TestChatAudioEmpty: an audio delta with nothing of the answer in it, its id alone, an
// empty transcript or data, null, is not content; one that has it after an empty one is.
func TestChatAudioEmpty(t *testing.T) {
	for _, tt := range []struct {
		delta   string
		content bool
	}{
		{`{"audio":{"id":"audio_1"}}`, false},
		{`{"audio":{"transcript":""}}`, false},
		{`{"audio":{"transcript":"","data":""}}`, false},
		{`{"audio":{"id":"audio_1","transcript":null,"data":null}}`, false},
		{`{"audio":null}`, false},
		{`{"audio":{}}`, false},
		{`{"audio":{"transcript":"Hi"},"audio":{"id":"a"}}`, false}, // the last audio member counts
		{`{"audio":{"transcript":"","transcript":"Hi"}}`, true},
		{`{"audio":{"data":"\u0041"}}`, true},
	} {
		m := New(OpenAIChat, true, t0)
		m.Feed([]byte(`data: {"choices":[{"index":0,"delta":`+tt.delta+`}]}`+"\n\n"), t0, nil)
		if m.Begun() != tt.content {
			t.Errorf("%s: content %v, want %v", tt.delta, m.Begun(), tt.content)
		}
		if r := m.Result(t0); r.Malformed != 0 {
			t.Errorf("%s: malformed", tt.delta)
		}
	}
}

// TestChatAudioBodyEstimate: a body with audio and no usage estimates its output from the
// transcript, the answer's text: the audio's base64 data is not text, 40 KB of it a second
// or so of speech, not 10,000 tokens.
func TestChatAudioBodyEstimate(t *testing.T) {
	data := strings.Repeat("UklGRnoGAABXQVZF", 2500)
	m := New(OpenAIChat, false, t0)
	m.Feed([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":null,"audio":{"id":"audio_1","expires_at":1729234747,"data":"`+data+`","transcript":"Hello there, friend."}}}]}`), t0, nil)
	r := m.Result(t0.Add(time.Second))
	if !r.Estimated || r.Usage.Output > 6 || r.Usage.Output < 5 {
		t.Fatalf("output %d estimated %v, want 5 or 6 (the transcript's 20 bytes / 4), estimated", r.Usage.Output, r.Estimated)
	}
}
