package events_test

import (
	"encoding/json"
	"testing"

	gojson "github.com/goccy/go-json"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// The codec was chosen by these: the hand-written decoder against encoding/json and
// goccy/go-json on the same 300-byte event (see README, "Measurements").
func benchData(b *testing.B) []byte {
	ev := sampleEvent()
	data := events.AppendRequest(nil, &ev)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	return data
}

func BenchmarkDecodeValidate(b *testing.B) {
	data := benchData(b)
	var ev events.RequestEvent
	for b.Loop() {
		if err := events.UnmarshalRequest(data, &ev); err != nil {
			b.Fatal(err)
		}
		if err := ev.ValidateAt(testNow); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecoderInterned(b *testing.B) {
	data := benchData(b)
	dec := events.NewDecoder(1024)
	var ev events.RequestEvent
	for b.Loop() {
		if err := dec.Decode(data, &ev); err != nil {
			b.Fatal(err)
		}
		if err := ev.ValidateAt(testNow); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecoderScores is BenchmarkDecoderInterned on the event with three inline scores:
// the slice that holds them is its one allocation.
func BenchmarkDecoderScores(b *testing.B) {
	ev := sampleEvent()
	ev.Scores = []events.Score{{Name: "quality", Value: 0.82}, {Name: "task_completed", Value: 1}, {Name: "rating", Value: 4}}
	data := events.AppendRequest(nil, &ev)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	dec := events.NewDecoder(1024)
	for b.Loop() {
		if err := dec.Decode(data, &ev); err != nil {
			b.Fatal(err)
		}
		if err := ev.ValidateAt(testNow); err != nil {
			b.Fatal(err)
		}
	}
}

type plainEvent events.RequestEvent // no custom (Un)MarshalJSON: reflection codecs

func BenchmarkDecodeEncodingJSON(b *testing.B) {
	data := benchData(b)
	var ev plainEvent
	for b.Loop() {
		if err := json.Unmarshal(data, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeGoccy(b *testing.B) {
	data := benchData(b)
	var ev plainEvent
	for b.Loop() {
		if err := gojson.Unmarshal(data, &ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	ev := sampleEvent()
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = events.AppendRequest(buf[:0], &ev)
	}
}

func BenchmarkSubjectAndBucket(b *testing.B) {
	buckets := events.DefaultBucketBounds()
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	n := 0
	for i := 0; b.Loop(); i++ {
		buf = events.AppendRequestSubject(buf[:0], "prod", "customer.service")
		n += buckets.Index(int64(i & 0xffff))
	}
	_ = n
}
