package report

import (
	"cmp"
	"slices"
)

// Change is one bucket in two reports; Before or After is nil where the bucket had no
// requests in that range.
type Change struct {
	Model  string `json:"model"`
	Scene  string `json:"scene"`
	Bucket string `json:"bucket"`
	Before *Row   `json:"before"`
	After  *Row   `json:"after"`
	lo     uint32
}

// Comparison is two reports matched bucket by bucket.
type Comparison struct {
	Before  Report   `json:"before"`
	After   Report   `json:"after"`
	Changes []Change `json:"changes"`
}

// Compare matches the rows of before and after by model, scene and bucket, in the order of
// the table: model, scene, then the bucket's lower bound.
func Compare(before, after Report) Comparison {
	type key struct{ model, scene, bucket string }
	idx := map[key]int{}
	var out []Change
	add := func(r *Row, isAfter bool) {
		k := key{r.Model, r.Scene, r.Bucket}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, Change{Model: r.Model, Scene: r.Scene, Bucket: r.Bucket, lo: r.BucketLo})
		}
		if isAfter {
			out[i].After = r
		} else {
			out[i].Before = r
		}
	}
	for i := range before.Rows {
		add(&before.Rows[i], false)
	}
	for i := range after.Rows {
		add(&after.Rows[i], true)
	}
	slices.SortFunc(out, func(a, b Change) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Scene, b.Scene), cmp.Compare(a.lo, b.lo), cmp.Compare(a.Bucket, b.Bucket))
	})
	if out == nil {
		out = []Change{}
	}
	return Comparison{Before: before, After: after, Changes: out}
}

// PctChange is the relative change from a to b in percent, and false when it is undefined
// (a is zero).
func PctChange(a, b float64) (float64, bool) {
	if a == 0 {
		return 0, false
	}
	return (b - a) / a * 100, true
}
