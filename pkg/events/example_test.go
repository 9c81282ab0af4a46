package events_test

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

func ExampleUnmarshalRequest() {
	data := []byte(`{"v":1,"event_id":"e1","ts":"2026-11-30T10:00:00.000Z","model":"qwen2.5-72b",
		"scene":"chat","env":"prod","input_tokens":1200,"output_tokens":101,
		"ttft_ms":350,"total_ms":4350,"status":"ok"}`)
	var ev events.RequestEvent
	if err := events.UnmarshalRequest(data, &ev); err != nil {
		fmt.Println(err)
		return
	}
	if err := ev.ValidateAt(time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)); err != nil {
		fmt.Println(err)
		return
	}
	tpot, _ := ev.TPOT()
	buckets := events.DefaultBucketBounds()
	fmt.Println(events.RequestSubject(ev.Env, ev.Scene), buckets.Label(buckets.Index(ev.InputTokens)), tpot)
	// Output: llm.req.prod.chat 500-1999 40
}

func ExampleRequestEvent_ValidateAt() {
	ev := events.RequestEvent{V: 1, EventID: "e2", TS: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
		Model: "m", Scene: "chat", Env: "prod", TTFTMs: 900, TotalMs: 800, Status: events.StatusOK}
	err := ev.ValidateAt(time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC))
	fmt.Println(err)
	fmt.Println(errors.Is(err, events.ErrInvalidEvent), errors.Is(err, events.ErrTTFTAboveTotal), events.Reason(err))
	// Output:
	// invalid event: ttft_ms: ttft_ms is above total_ms (900 > 800)
	// true true ttft_above_total
}

func ExampleRequestSubject() {
	// Labels can never change a subject's shape.
	fmt.Println(events.RequestSubject("prod", "search.v2 > beta"))
	// Output: llm.req.prod.search_v2___beta
}

func ExampleFitLabel() {
	scene := events.FitLabel("support-"+strings.Repeat("x", 300), events.MaxLabelLen)
	fmt.Println(len(scene), scene[:12], scene[len(scene)-9:len(scene)-8])
	fmt.Println(events.FitLabel("chat", events.MaxLabelLen))
	// Output:
	// 256 support-xxxx ~
	// chat
}
