package events

import "testing"

// TestKnownKeyLists: the lists the letter-case check reads hold every key the decoders
// know, and nothing else.
func TestKnownKeyLists(t *testing.T) {
	for _, tc := range []struct {
		names []string
		bit   func(string) uint64
	}{{requestKeys, requestKey}, {feedbackKeys, feedbackKey}} {
		var all uint64
		for _, name := range tc.names {
			b := tc.bit(name)
			if b == 0 || all&b != 0 {
				t.Fatalf("%q: bit %b", name, b)
			}
			all |= b
		}
		if all != 1<<len(tc.names)-1 {
			t.Fatalf("the list of %d keys misses some: %b", len(tc.names), all)
		}
	}
}
