// Calls one endpoint with the official SDKs and prints what a client sees, one JSON line per
// case, so the Go test can compare a direct call with one through the proxy.
// usage: node run.mjs <base URL>
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const base = process.argv[2];
const headers = { "X-Tokenscope-Scene": "sdk" };
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "sk-test", defaultHeaders: headers, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: "sk-ant-test", defaultHeaders: headers, maxRetries: 0 });
const messages = [{ role: "user", content: "say something short please" }];
const out = {};

// OpenAI chat, streamed, without asking for usage: the proxy must hide the usage chunk it adds.
{
  const stream = await openai.chat.completions.create({ model: "gpt-4o", messages, max_tokens: 6, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  out.openai_stream = chunks;
}
// OpenAI chat, streamed, asking for usage.
{
  const stream = await openai.chat.completions.create({ model: "gpt-4o", messages, max_tokens: 6, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  out.openai_stream_usage = chunks;
}
out.openai_whole = await openai.chat.completions.create({ model: "gpt-4o", messages, max_tokens: 6 });
out.openai_completions = await openai.completions.create({ model: "gpt-3.5-turbo-instruct", prompt: "say something", max_tokens: 4 });
// Anthropic, streamed through the SDK's helper, and not streamed.
{
  const stream = anthropic.messages.stream({ model: "claude-sonnet-4-5", max_tokens: 6, messages });
  const evs = [];
  for await (const e of stream) evs.push(e);
  out.anthropic_stream = evs;
  out.anthropic_final = await stream.finalMessage();
}
out.anthropic_whole = await anthropic.messages.create({ model: "claude-sonnet-4-5", max_tokens: 6, messages });
// An error the SDK must surface as its typed error.
try {
  await openai.chat.completions.create({ model: "gpt-4o", messages, max_tokens: 6 }, { headers: { "X-Fakellm-Mode": "ratelimit" } });
  out.openai_429 = "no error";
} catch (e) {
  out.openai_429 = { status: e.status, name: e.constructor.name, type: e.type ?? e.error?.type };
}
console.log(JSON.stringify(out));
