package scrape

import "github.com/tokenscope/tokenscope/pkg/events"

// field is one reading of an engine sample.
type field uint8

const (
	// gauges
	fRunning field = iota
	fWaiting
	fKVUsage
	fBatch
	fHitRate
	fGenThroughput
	// counters, published as deltas
	fPrefixQueries
	fPrefixHits
	fPreemptions
	fPromptTokens
	fGenTokens
	// histograms, published as bucket deltas
	fQueueTime
	fTTFT
	fPrefillTime
	fDecodeTime
	fIterationTokens
	fGeneratedTokens
	numFields
)

const (
	firstCounter   = fPrefixQueries
	firstHistogram = fQueueTime
)

// mapping is how one exported family becomes a field. legacy marks an older name read
// only when the current one is absent. created names the family of a counter's or
// histogram's creation times (prometheus_client's _created series: the Unix time each
// series was made at), and isCreated marks that family itself.
type mapping struct {
	f         field
	legacy    bool
	created   string
	isCreated bool
}

// A counter is looked up both with and without _total: Python's prometheus_client writes
// the TYPE line with the suffix, other writers without. Its creation times are
// name_created (a gauge family of their own in the text format, beside the counter in
// OpenMetrics).
func counter(m map[string]mapping, name string, f field) {
	c := name + "_created"
	m[name] = mapping{f: f, created: c}
	m[name+"_total"] = mapping{f: f, created: c}
	m[c] = mapping{f: f, isCreated: true}
}

// legacyCounter is counter for an older name, read only where the current one is absent.
func legacyCounter(m map[string]mapping, name string, f field) {
	c := name + "_created"
	m[name] = mapping{f: f, legacy: true, created: c}
	m[name+"_total"] = mapping{f: f, legacy: true, created: c}
	m[c] = mapping{f: f, legacy: true, isCreated: true}
}

// withCreated adds the creation-time family of each histogram of m: the histogram's name
// and _created.
func withCreated(m map[string]mapping) map[string]mapping {
	for name, mp := range m {
		if mp.f >= firstHistogram && !mp.isCreated {
			c := name + "_created"
			mp.created = c
			m[name] = mp
			m[c] = mapping{f: mp.f, legacy: mp.legacy, isCreated: true}
		}
	}
	return m
}

// names maps each engine's exported families to fields; these are the names the engines
// document (vLLM v1 metrics, SGLang's --enable-metrics, TGI's /metrics).
var names = func() map[string]map[string]mapping {
	vllm := map[string]mapping{
		"vllm:num_requests_running":         {f: fRunning},
		"vllm:num_requests_waiting":         {f: fWaiting},
		"vllm:kv_cache_usage_perc":          {f: fKVUsage},
		"vllm:gpu_cache_usage_perc":         {f: fKVUsage, legacy: true},
		"vllm:request_queue_time_seconds":   {f: fQueueTime},
		"vllm:time_to_first_token_seconds":  {f: fTTFT},
		"vllm:request_prefill_time_seconds": {f: fPrefillTime},
		"vllm:request_decode_time_seconds":  {f: fDecodeTime},
		"vllm:iteration_tokens_total":       {f: fIterationTokens},
	}
	counter(vllm, "vllm:prefix_cache_queries", fPrefixQueries)
	counter(vllm, "vllm:prefix_cache_hits", fPrefixHits)
	// vLLM 0.8's names of the same counters; 0.9 exports both, 0.10 only the new ones
	legacyCounter(vllm, "vllm:gpu_prefix_cache_queries", fPrefixQueries)
	legacyCounter(vllm, "vllm:gpu_prefix_cache_hits", fPrefixHits)
	counter(vllm, "vllm:num_preemptions", fPreemptions)
	counter(vllm, "vllm:prompt_tokens", fPromptTokens)
	counter(vllm, "vllm:generation_tokens", fGenTokens)

	sglang := map[string]mapping{
		"sglang:num_running_reqs":            {f: fRunning},
		"sglang:num_queue_reqs":              {f: fWaiting},
		"sglang:token_usage":                 {f: fKVUsage},
		"sglang:cache_hit_rate":              {f: fHitRate},
		"sglang:gen_throughput":              {f: fGenThroughput},
		"sglang:time_to_first_token_seconds": {f: fTTFT},
		"sglang:queue_time_seconds":          {f: fQueueTime},
	}
	counter(sglang, "sglang:prompt_tokens", fPromptTokens)
	counter(sglang, "sglang:generation_tokens", fGenTokens)

	tgi := map[string]mapping{
		"tgi_queue_size":               {f: fWaiting},
		"tgi_batch_current_size":       {f: fBatch},
		"tgi_request_queue_duration":   {f: fQueueTime},
		"tgi_request_generated_tokens": {f: fGeneratedTokens},
	}
	return map[string]map[string]mapping{events.EngineVLLM: withCreated(vllm), events.EngineSGLang: withCreated(sglang), events.EngineTGI: withCreated(tgi)}
}()

// modelLabel is the label that names the model, or "" where the engine has none.
func modelLabel(engine string) string {
	if engine == events.EngineTGI {
		return ""
	}
	return "model_name"
}

// maxed are the gauges that are not additive across the engine cores of one model (vLLM's
// engine label under data parallelism): the highest is kept, not the sum.
func maxed(f field) bool { return f == fKVUsage || f == fHitRate }

// set writes v into the sample's field f.
func set(s *events.EngineSample, f field, v float64) {
	p := &v
	switch f {
	case fRunning:
		s.Running = p
	case fWaiting:
		s.Waiting = p
	case fKVUsage:
		s.KVCacheUsage = p
	case fBatch:
		s.BatchSize = p
	case fHitRate:
		s.CacheHitRate = p
	case fGenThroughput:
		s.GenThroughput = p
	case fPrefixQueries:
		s.PrefixCacheQueries = p
	case fPrefixHits:
		s.PrefixCacheHits = p
	case fPreemptions:
		s.Preemptions = p
	case fPromptTokens:
		s.PromptTokens = p
	case fGenTokens:
		s.GenerationTokens = p
	}
}

// setHist writes h into the sample's histogram field f.
func setHist(s *events.EngineSample, f field, h *events.HistogramDelta) {
	switch f {
	case fQueueTime:
		s.QueueTime = h
	case fTTFT:
		s.TTFT = h
	case fPrefillTime:
		s.PrefillTime = h
	case fDecodeTime:
		s.DecodeTime = h
	case fIterationTokens:
		s.IterationTokens = h
	case fGeneratedTokens:
		s.GeneratedTokens = h
	}
}
