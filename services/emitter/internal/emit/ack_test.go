package emit

import (
	"strings"
	"testing"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

type holder struct{}

func (holder) Publish(string, string, []byte) bool { return true }

type storing struct{ holder }

func (storing) NewBatch() *bus.Batch { return new(bus.Batch) }

// TestStoreWait: with a publisher that can tell, a request waits for its events to be stored
// unless it asks for buffered; one that cannot tell answers once it holds them, and says so
// to a request that asks for stored; any other value is refused naming both.
func TestStoreWait(t *testing.T) {
	tests := []struct {
		pub     Publisher
		ack     string
		wait    bool
		errPart string
	}{
		{storing{}, "", true, ""},
		{storing{}, "stored", true, ""},
		{storing{}, " Stored ", true, ""},
		{storing{}, "buffered", false, ""},
		{storing{}, "BUFFERED", false, ""},
		{storing{}, "later", false, `"later" is neither stored nor buffered`},
		{storing{}, strings.Repeat("x", 1000), false, "is neither"},
		{holder{}, "", false, ""},
		{holder{}, "buffered", false, ""},
		{holder{}, "stored", false, "cannot tell when events are stored"},
	}
	for _, tc := range tests {
		b, err := StoreWait(tc.pub, tc.ack)
		switch {
		case tc.errPart != "":
			if err == nil || !strings.Contains(err.Error(), tc.errPart) || len(err.Error()) > 200 {
				t.Errorf("%T %q: err %v, want one with %q", tc.pub, tc.ack, err, tc.errPart)
			}
		case err != nil:
			t.Errorf("%T %q: %v", tc.pub, tc.ack, err)
		case (b != nil) != tc.wait:
			t.Errorf("%T %q: waits %v, want %v", tc.pub, tc.ack, b != nil, tc.wait)
		}
	}
}
