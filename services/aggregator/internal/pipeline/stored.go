package pipeline

import "sort"

// storedSet is the requests ledger read at start: the stream positions, in order, whose
// requests are already in ClickHouse. It lists each position, not a high-water mark, so a
// position missing from the table is written when the replay brings it again.
type storedSet struct {
	seqs []uint64 // ascending
}

func (s *storedSet) has(seq uint64) bool {
	if len(s.seqs) == 0 || seq > s.seqs[len(s.seqs)-1] {
		return false
	}
	i := sort.Search(len(s.seqs), func(i int) bool { return s.seqs[i] >= seq })
	return s.seqs[i] == seq
}

// last returns the highest position in the set, 0 when it is empty.
func (s *storedSet) last() uint64 {
	if len(s.seqs) == 0 {
		return 0
	}
	return s.seqs[len(s.seqs)-1]
}

// passed lets the set go once everything consumed from now on lies after its last position.
func (s *storedSet) passed(seq uint64) {
	if len(s.seqs) > 0 && seq >= s.seqs[len(s.seqs)-1] {
		s.seqs = nil
	}
}
