package events_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// FuzzDecodeValidate feeds arbitrary bytes to both decoders and the validator. They must
// never panic, must agree with each other, and whatever they accept must be JSON that
// encoding/json also accepts and must survive an encode/decode round trip unchanged.
func FuzzDecodeValidate(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "request", "*", "*.json"))
	for _, s := range seeds {
		raw, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Add([]byte(`{"v":1,"x":[{"y":"\u0000"}],"input_tokens":1e2}`))
	dec := events.NewDecoder(64)
	f.Fuzz(func(t *testing.T, data []byte) {
		var a, b events.RequestEvent
		errA := events.UnmarshalRequest(data, &a)
		errB := dec.Decode(data, &b)
		if (errA == nil) != (errB == nil) {
			t.Fatalf("decoders disagree: %v vs %v", errA, errB)
		}
		if errA != nil {
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted input that is not JSON: %q", data)
		}
		if a.ValidateAt(testNow) != nil {
			return
		}
		var c events.RequestEvent
		enc := events.AppendRequest(nil, &a)
		if err := events.UnmarshalRequest(enc, &c); err != nil {
			t.Fatalf("cannot decode own encoding %s: %v", enc, err)
		}
		if err := c.ValidateAt(testNow); err != nil {
			t.Fatalf("own encoding %s of a valid event is invalid: %v", enc, err)
		}
	})
}
