// Package baseline keeps the seasonal history of each series' metrics and answers, for a
// window, the baseline the dynamic rules compare it with: the same time-of-day slot
// (± Slot) on each of the previous Days days, optionally only the days of the same kind
// (weekday or weekend).
//
// History is kept per cell of Step (5 min by default) as a count, a Welford mean and sum
// of squares, and a small deterministic reservoir sample for the robust median and MAD, so
// a week of 15 s windows costs a few hundred bytes per series-hour instead of every value.
// Cells of past days never change, so a baseline is computed once per step and cached.
package baseline
