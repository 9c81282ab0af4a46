// Package fakellm is an LLM server for tests, demos and benchmarks. It speaks OpenAI's
// chat, completions and Responses APIs and Anthropic's messages API, streamed (SSE) and not, with the
// providers' documented event sequences, and it can be told to be slow, fail, rate-limit,
// stall, disconnect, send malformed SSE or gzip its bodies: globally with Options, or per
// request with X-Fakellm-* headers. Its output is a pure function of the request, so a
// direct call and a proxied one can be compared byte for byte.
//
// With the scheduler model on (Options.MaxBatch, KVTokens, PrefixCache) it also paces
// requests like an inference engine: a bounded batch, a KV-token budget that preempts the
// newest request when it overflows, a FIFO queue, a block prefix cache, and vLLM's engine
// metrics on /metrics computed from what it did. The scheduler changes timing only.
package fakellm
