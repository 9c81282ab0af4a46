// Package proxy is the LLM gateway: it forwards OpenAI-compatible and Anthropic requests to
// their upstream untouched, streams the answer back flushed chunk by chunk, and measures
// each request on the way (true TTFT, total, longest gap, usage, status), publishing one
// request event per request without ever delaying or failing the client's request.
package proxy
