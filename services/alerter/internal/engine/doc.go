// Package engine evaluates one window of rollups against the rules: it merges each
// env × scene × model × bucket series over its instances (counts add, percentiles come
// from the merged t-digest centroids, never from averages), joins token rollups with GPU
// rollups per host for the efficiency metrics, checks dynamic thresholds where the
// baseline and the window's traffic allow and the static SLA rules elsewhere, learns the
// window into the baselines, and returns the alert state changes the window caused.
package engine
