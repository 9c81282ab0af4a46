package pipeline

import "testing"

// TestRecentIDs checks the dedup memory: the first position of an id stands, a replay of
// that position is not a duplicate, and past its size the oldest id is forgotten first.
func TestRecentIDs(t *testing.T) {
	r := newRecentIDs(3)
	h := func(id string) uint64 { return r.hash(id) }
	if first := r.add(h("a"), 10); first != 10 {
		t.Fatalf("first of a new id: %d", first)
	}
	if first := r.add(h("a"), 12); first != 10 {
		t.Fatalf("a again at 12: first %d, want 10 (a duplicate)", first)
	}
	if first := r.add(h("a"), 10); first != 10 {
		t.Fatalf("a replayed at 10: first %d, want 10 (not a duplicate)", first)
	}
	r.add(h("b"), 13)
	r.add(h("c"), 14)
	r.add(h("d"), 15) // forgets a
	if r.len() != 3 {
		t.Fatalf("%d ids remembered, want 3", r.len())
	}
	if first := r.add(h("a"), 16); first != 16 {
		t.Fatalf("a after it was forgotten: first %d, want 16", first)
	}
	if first := r.add(h("c"), 17); first != 14 {
		t.Fatalf("c: first %d, want 14", first)
	}
	off := newRecentIDs(0)
	off.add(off.hash("x"), 1)
	if first := off.add(off.hash("x"), 2); first != 2 {
		t.Fatalf("with no memory every id is new: first %d", first)
	}
}
