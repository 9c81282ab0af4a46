package meter

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestResponsesLongAnswer: a Responses stream's response.completed repeats the whole
// output, so it is as long as the answer: a long answer's terminal event must still give
// its usage and end the stream, not pass unread (meter_overflow) and leave it truncated.
func TestResponsesLongAnswer(t *testing.T) {
	text := strings.Repeat("a", 4<<10)
	stream := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"" + text[:100] + "\"}\n\n" +
		"event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"" + text + "\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"" + text + "\"}]}],\"usage\":{\"input_tokens\":9,\"output_tokens\":1000}}}\n\n"
	wantCompletedPastLimit(t, stream)
}

// TestResponsesLargeImageEvent: the image_generation tool streams each partial image as one
// event of its base64, often over a MiB; that event carries no usage and passes unread, but
// the answer is still an answer: its response.completed (whose output repeats the image, so
// is as long) must still give the usage, and the request is no error.
func TestResponsesLargeImageEvent(t *testing.T) {
	img := strings.Repeat("QUJD", 1<<9)
	stream := "event: response.image_generation_call.partial_image\ndata: {\"type\":\"response.image_generation_call.partial_image\",\"partial_image_index\":0,\"partial_image_b64\":\"" + img + "\"}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"here\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"output\":[{\"type\":\"image_generation_call\",\"result\":\"" + img + "\"}],\"usage\":{\"input_tokens\":9,\"output_tokens\":1000}}}\n\n"
	wantCompletedPastLimit(t, stream)
}

// wantCompletedPastLimit meters a Responses stream event by event under a 1 KiB event
// limit and wants it ok, with its response.completed's usage (9 in, 1000 out).
func wantCompletedPastLimit(t *testing.T, stream string) {
	t.Helper()
	m := New(OpenAIResponses, true, t0)
	m.SetMaxEvent(1 << 10)
	m.SetInputEstimate(7)
	for i, ev := range splitEvents([]byte(stream)) {
		m.Feed(ev, t0.Add(time.Duration(i+1)*time.Millisecond), nil)
	}
	m.Flush(t0.Add(10*time.Millisecond), nil)
	r := m.Result(t0.Add(10 * time.Millisecond))
	if st, code := r.Status(true); st != events.StatusOK || r.Usage != (Usage{9, 1000, 0}) {
		t.Fatalf("status %s %q usage %+v estimated %v, want ok {9 1000 0}", st, code, r.Usage, r.Estimated)
	}
}
