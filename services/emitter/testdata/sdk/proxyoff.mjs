// Calls an emitter whose proxy is off (EMITTER_UPSTREAM_URL=none) with the official SDKs and
// their default retries, and prints what each SDK threw, one JSON line.
// usage: node proxyoff.mjs <base URL>
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const base = process.argv[2];
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "sk-openai-test" });
const anthropic = new Anthropic({ baseURL: base, apiKey: "sk-ant-test" });
const seen = (e) => ({ class: e.constructor.name, status: e.status, code: e.code ?? e.error?.error?.type ?? null });
const out = {};
try {
  await openai.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "hi" }] });
} catch (e) {
  out.openai = seen(e);
}
try {
  await anthropic.messages.create({ model: "claude-sonnet-4-5", max_tokens: 4, messages: [{ role: "user", content: "hi" }] });
} catch (e) {
  out.anthropic = seen(e);
}
console.log(JSON.stringify(out));
