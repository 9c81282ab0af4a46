// Exports spans to an OTLP/HTTP endpoint with the OpenTelemetry JavaScript SDK and its
// @opentelemetry/exporter-trace-otlp-http exporter (OTLP/JSON), as a Node service would:
// <engine> llm_request spans shaped as vLLM's, <app> GenAI chat spans, and <other> spans of
// no LLM kind. Prints one JSON line with what each export returned.
// usage: node run.mjs <traces URL> <token> <engine> <app> <other>
import { SpanKind, SpanStatusCode } from "@opentelemetry/api";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";

const [url, token, engine, app, other] = process.argv.slice(2);
const results = [];

function provider(attrs) {
  const exporter = new OTLPTraceExporter({ url, headers: { Authorization: "Bearer " + token } });
  // Record each export's result: the test fails on any that did not succeed.
  const exportOrig = exporter.export.bind(exporter);
  exporter.export = (spans, done) => exportOrig(spans, (r) => { results.push(r.code); done(r); });
  return new BasicTracerProvider({
    resource: resourceFromAttributes(attrs),
    spanProcessors: [new BatchSpanProcessor(exporter, { maxExportBatchSize: 100, scheduledDelayMillis: 50 })],
  });
}

const now = Date.now();
const vllm = provider({ "service.name": "vllm-node", "deployment.environment.name": "node" });
const et = vllm.getTracer("vllm");
for (let i = 0; i < Number(engine); i++) {
  const span = et.startSpan("llm_request", {
    kind: SpanKind.SERVER,
    startTime: now - 4000,
    attributes: {
      "gen_ai.response.model": "Qwen/Qwen2.5-7B-Instruct",
      "gen_ai.request.id": "cmpl-node-" + i,
      "gen_ai.usage.prompt_tokens": 512,
      "gen_ai.usage.completion_tokens": 64,
      "gen_ai.latency.time_in_queue": 0.02,
      "gen_ai.latency.time_to_first_token": 0.25,
      "gen_ai.latency.e2e": 1.5,
      "gen_ai.latency.time_in_model_prefill": 0.2,
      "gen_ai.latency.time_in_model_decode": 1.25,
    },
  });
  span.end(now - 2500);
}
const bot = provider({ "service.name": "node-bot", "deployment.environment": "node" });
const at = bot.getTracer("genai");
for (let i = 0; i < Number(app); i++) {
  const span = at.startSpan("chat claude-sonnet-4-5", {
    kind: SpanKind.CLIENT,
    startTime: now - 3000,
    attributes: {
      "gen_ai.operation.name": "chat",
      "gen_ai.system": "anthropic", // the older name of gen_ai.provider.name
      "gen_ai.request.model": "claude-sonnet-4-5",
      "gen_ai.usage.input_tokens": 900,
      "gen_ai.usage.output_tokens": 120,
      "gen_ai.response.finish_reasons": ["end_turn"],
    },
  });
  if (i % 10 === 9) {
    span.setAttribute("error.type", "overloaded_error");
    span.setStatus({ code: SpanStatusCode.ERROR });
  }
  span.end(now - 1000);
}
for (let i = 0; i < Number(other); i++) at.startSpan("GET /healthz", { kind: SpanKind.SERVER }).end();

await vllm.shutdown();
await bot.shutdown();
console.log(JSON.stringify({ exports: results.length, failed: results.filter((c) => c !== 0).length }));
