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

// A request event may carry the app's own verdicts inline: each counts as a feedback verdict
// of source app on this request.
func ExampleScore() {
	data := []byte(`{"v":1,"event_id":"e3","ts":"2026-11-30T10:00:00.000Z","model":"m","scene":"chat",
		"env":"prod","input_tokens":10,"output_tokens":5,"ttft_ms":100,"total_ms":300,"status":"ok",
		"scores":{"quality":0.82,"task_completed":true}}`)
	var ev events.RequestEvent
	if err := events.UnmarshalRequest(data, &ev); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ev.Scores)
	ev.Scores = append(ev.Scores, events.Score{Name: "not a name", Value: 1})
	fmt.Println(ev.ValidateAt(time.Date(2026, 11, 30, 10, 1, 0, 0, time.UTC)))
	// Output:
	// [{quality 0.82} {task_completed 1}]
	// invalid event: scores: value out of range ("not a name" is not letters, digits, '_', '-' or '.')
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

// An engine sample's histogram holds per-bucket deltas: the deltas of several ticks add
// bucket by bucket, and a quantile is interpolated within its bucket.
func ExampleUnmarshalEngineSample() {
	data := []byte(`{"v":1,"ts":"2026-11-30T10:00:01.000Z","host":"gpu-node-3","engine":"vllm","name":"vllm",
		"model":"meta-llama/Llama-3.1-8B-Instruct","up":true,"delta_seconds":1,"waiting":4,
		"queue_time_seconds":{"le":[0.3,1,5],"counts":[6,3,1,0],"sum":4.1,"count":10}}`)
	var s events.EngineSample
	if err := events.UnmarshalEngineSample(data, &s); err != nil {
		fmt.Println(err)
		return
	}
	if err := s.ValidateAt(time.Date(2026, 11, 30, 10, 0, 2, 0, time.UTC)); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(events.EngineSampleSubject(s.Host), *s.Waiting, s.QueueTime.Count, s.Running == nil)
	// Output: engine.sample.gpu-node-3 4 10 true
}

func ExampleMarshalEngineSample() {
	s := events.EngineSample{V: events.Version, TS: time.Date(2026, 11, 30, 10, 0, 1, 0, time.UTC),
		Host: "gpu-node-3", Engine: events.EngineTGI, Name: "tgi", Up: false, Error: "timeout"}
	data, err := events.MarshalEngineSample(&s)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(data))
	// Output: {"v":1,"host":"gpu-node-3","engine":"tgi","name":"tgi","up":false,"error":"timeout","ts":"2026-11-30T10:00:01.000Z"}
}

// A host sample's rates are the kernel counters' deltas over delta_seconds; a reading
// that could not be read is absent.
func ExampleUnmarshalHostSample() {
	data := []byte(`{"v":1,"ts":"2026-11-30T10:00:01.000Z","host":"gpu-node-3",
		"mem_total_bytes":68719476736,"mem_used_bytes":1073741824,"mem_available_bytes":67645734912,
		"delta_seconds":1,"net_rx_bps":125000000,"net_tx_bps":9000000}`)
	var s events.HostSample
	if err := events.UnmarshalHostSample(data, &s); err != nil {
		fmt.Println(err)
		return
	}
	if err := s.ValidateAt(time.Date(2026, 11, 30, 10, 0, 2, 0, time.UTC)); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(events.HostSampleSubject(s.Host), *s.NetRxBps, s.DiskReadBps == nil)
	// Output: host.sample.gpu-node-3 1.25e+08 true
}
