// Package replay drives load shaped like production: it reads Azure LLM inference traces
// (TIMESTAMP,ContextTokens,GeneratedTokens), generates workloads with the same shape when no
// trace is given, and plays either at a speed factor, against a real endpoint or simulated
// with the latency model documented on Model.
package replay
