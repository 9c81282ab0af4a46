// Package scrape reads the Prometheus endpoints of the inference engines on the host
// (vLLM, SGLang, TGI) on gpuwatch's tick, turns what each exports into one engine sample
// per engine × model — gauges as read, counters and histograms as deltas since the
// previous scrape that survive an engine restart — and publishes them to
// engine.sample.<host>. The exposition is parsed with prometheus/common's expfmt.
package scrape
