package ingest

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzItems checks the array's items against encoding/json: an array it reads is split into
// the items it finds, and an array it refuses is refused.
func FuzzItems(f *testing.F) {
	for _, s := range []string{`[]`, `[1]`, `[ {"a":"]}"} , [1,[2]], "\"[" ]`, `[1,]`, `[{]}`, `[1] x`, `[{"a":1}`, `["\\"]`, "[\x0b1]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if len(body) == 0 || body[0] != '[' {
			return
		}
		var want []json.RawMessage
		wantErr := json.Unmarshal(body, &want)
		var got [][]byte
		err := items(body, nil)
		if err == nil {
			_ = items(body, func(item []byte) { got = append(got, item) })
		}
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: error %v, encoding/json's %v", body, err, wantErr)
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d items, encoding/json %d", body, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("%q: item %d %q, encoding/json %q", body, i, got[i], want[i])
			}
		}
	})
}
