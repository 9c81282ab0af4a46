// Runs statements on chDB (ClickHouse embedded in libchdb) for pkg/testbed's Current: one
// JSON request per line on stdin, one JSON answer per line on stdout, in order.
//
//   request: {"sql": "...", "params": {"name": "value"}, "format": "JSONCompact"}
//   answer:  {"ok": true, "out": "<the result as the server printed it>"}
//            {"ok": false, "error": "<the server's message>"}
//
// params, when present, are bound by the server ({name:Type} placeholders), as
// clickhouse-client --param_name and the HTTP interface's param_name bind them.
// argv[2] is the data folder of the session.
"use strict";

const readline = require("node:readline");
const { Session } = require("chdb");

const session = new Session(process.argv[2]);
const answer = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

answer({ ok: true, out: session.query("SELECT version()", "TabSeparated").trim() });

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch (e) {
    answer({ ok: false, error: "driver: cannot parse request: " + e.message });
    return;
  }
  try {
    const format = req.format || "TabSeparated";
    const out = req.params
      ? session.queryBind(req.sql, req.params, format)
      : session.query(req.sql, format);
    answer({ ok: true, out: out === undefined || out === null ? "" : String(out) });
  } catch (e) {
    answer({ ok: false, error: String(e && e.message ? e.message : e) });
  }
});
rl.on("close", () => {
  session.close();
});
