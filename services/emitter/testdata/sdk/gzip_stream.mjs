// Streams one OpenAI chat completion whose upstream gzips its SSE, with the official SDK, and
// prints the chunks the SDK yields, so the Go test can compare a direct call with one through
// the proxy.
// usage: node gzip_stream.mjs <base URL>
import OpenAI from "openai";

const base = process.argv[2];
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "sk-test", maxRetries: 0, defaultHeaders: { "X-Fakellm-Mode": "gzip" } });
const stream = await openai.chat.completions.create({
  model: "gpt-4o", max_tokens: 6, stream: true,
  messages: [{ role: "user", content: "say something short please" }],
});
const chunks = [];
for await (const c of stream) chunks.push(c);
console.log(JSON.stringify(chunks));
