// Package llmclient sends one request of either protocol to an LLM endpoint and measures the
// answer from the client's side with the same meter the proxy uses; bench and replay drive
// endpoints through it.
package llmclient
