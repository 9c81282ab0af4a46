// Package replay plays back recorded GPU samples: a file of JSON lines, one GPU sample
// each, as gpuwatch publishes them (`nats sub 'gpu.sample.>' --raw > samples.jsonl`
// records one). Playback keeps the recording's timing relative to its first sample and
// loops for ever; each loop adds the recording's energy use to the energy counter, so the
// counter never falls when the recording starts over.
package replay
