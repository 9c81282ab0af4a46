// Package fakellm is an LLM server for tests, demos and benchmarks. It speaks OpenAI's
// chat and completions APIs and Anthropic's messages API, streamed (SSE) and not, with the
// providers' documented event sequences, and it can be told to be slow, fail, rate-limit,
// stall, disconnect, send malformed SSE or gzip its bodies: globally with Options, or per
// request with X-Fakellm-* headers. Its output is a pure function of the request, so a
// direct call and a proxied one can be compared byte for byte.
package fakellm
