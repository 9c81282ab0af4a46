// Package events is tokenscope's wire contract in Go: the request event (with its optional
// inline scores), feedback event, GPU sample, token and GPU rollups and alerts, their JSON codec and validation, the NATS subjects they travel
// on, input-token buckets and the derived metrics (TPOT) that follow vLLM's benchmark.
//
// Every service imports this package and it imports no service. The JSON Schemas under
// schemas/ describe the same messages for other languages; a conformance test keeps the
// two in step.
package events
