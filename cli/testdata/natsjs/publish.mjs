// Publishes request events to JetStream with nats.js, the way schemas/README.md shows:
// subject llm.req.<env>.<scene>, event_id as the Nats-Msg-Id (msgID). The payload is the
// README's example event (argv[4], JSON) with a fresh event_id and ts per event. Then it
// publishes the first event again and checks that JetStream reports it as a duplicate.
// Prints {"ids":[…]} on success.
// usage: node publish.mjs <nats-url> <count> <event-json>
import { connect } from "nats";
import { randomUUID } from "node:crypto";

const [servers, count, template] = process.argv.slice(2);
const base = JSON.parse(template);
const nc = await connect({ servers });
const js = nc.jetstream();
const sanitize = (s) => s.replace(/[^A-Za-z0-9_-]/g, "_");
const subject = `llm.req.${sanitize(base.env)}.${sanitize(base.scene)}`;
const ids = [];
let first;
for (let i = 0; i < Number(count); i++) {
  const ev = { ...base, event_id: randomUUID(), ts: new Date().toISOString() };
  const ack = await js.publish(subject, JSON.stringify(ev), { msgID: ev.event_id });
  if (ack.duplicate) throw new Error(`event ${ev.event_id} was taken for a duplicate`);
  ids.push(ev.event_id);
  first ??= ev;
}
const again = await js.publish(subject, JSON.stringify(first), { msgID: first.event_id });
if (!again.duplicate) throw new Error("a repeated Nats-Msg-Id was not deduplicated");
await nc.drain();
console.log(JSON.stringify({ ids }));
