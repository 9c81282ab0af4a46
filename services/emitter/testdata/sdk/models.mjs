// Lists the models with the official SDKs, as apps and Claude Code do before their first
// request, and prints the ids each SDK got, one JSON line.
// usage: node models.mjs <base URL>
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const base = process.argv[2];
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "sk-openai-test", maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: "sk-ant-test", maxRetries: 0 });
const out = { openai: [], anthropic: [] };
for await (const m of openai.models.list()) out.openai.push(m.id);
for await (const m of anthropic.models.list()) out.anthropic.push(m.id);
out.anthropic_one = (await anthropic.models.retrieve("claude-sonnet-4-5")).id;
console.log(JSON.stringify(out));
