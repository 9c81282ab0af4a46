// Package meter watches an LLM response as it passes through, without changing it, and
// measures what the user feels: the time to the first content event (not the first byte),
// the time to the last one, the longest gap between two, the token usage the protocol
// reports, and how the response ended. It understands OpenAI's chat, completions and
// Responses SSE, Anthropic's messages SSE, and both providers' non-streamed JSON bodies, and
// reads their JSON as the providers' clients do: member names exactly, the last of a duplicate winning.
// It holds at most one SSE event at a time, up to a limit (SetMaxEvent): a longer event
// passes through unread and the result says so (CodeOverflow), but for a Responses event,
// read as it passes, keeping only the few members the meter needs of it.
package meter
