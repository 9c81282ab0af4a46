package meter

import (
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
