package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/cli/internal/stack"
	"github.com/tokenscope/tokenscope/pkg/chdb"
	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/pkg/testbed"
)

const natsjsDir = "../../testdata/natsjs"

// readmeEvent returns the example request event of schemas/README.md, the payload every
// language's snippet there publishes.
func readmeEvent(t *testing.T) (raw string, fields map[string]any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rootDir(t), "schemas", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```json\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatal("schemas/README.md has no ```json block")
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, m[1]); err != nil {
		t.Fatalf("the README's event is not JSON: %v", err)
	}
	if err := json.Unmarshal(compact.Bytes(), &fields); err != nil {
		t.Fatal(err)
	}
	return compact.String(), fields
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startService starts one of the built service binaries and waits for its /readyz.
func startService(t *testing.T, bin, name, httpAddr string, env ...string) {
	t.Helper()
	p, err := stack.Start(stack.Cmd{Name: name, Path: filepath.Join(bin, name), Env: append(env, "HTTP_ADDR="+httpAddr),
		Log: filepath.Join(t.TempDir(), name+".log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Error(err)
		}
	})
	if err := p.WaitReady(context.Background(), "http://"+httpAddr+"/readyz", 90*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestPublishAnyLanguage publishes schemas/README.md's request event with nats.js (npm nats)
// to JetStream and, with the root README's curl commands, to the emitter's HTTP ingest with a
// verdict on one of them, runs the real aggregator binary, and finds every event, with the
// README's values, and the verdict in ClickHouse.
func TestPublishAnyLanguage(t *testing.T) {
	need(t, "node", "npm", "curl")
	if _, err := os.Stat(filepath.Join(natsjsDir, "node_modules")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = natsjsDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", natsjsDir, err, out)
		}
	}
	payload, want := readmeEvent(t)
	ns := testbed.NATS(t)
	chCfg := testbed.ClickHouse(t)
	bin := services(t)
	common := []string{"NATS_URL=" + ns.ClientURL(), "CLICKHOUSE_ADDR=" + chCfg.Addr, "CLICKHOUSE_HTTP_ADDR=" + chCfg.HTTPAddr, "CLICKHOUSE_DB=" + chCfg.DB}
	startService(t, bin, "aggregator", freeAddr(t), append(common, "AGG_WINDOW=1s", "AGG_LATENESS=1s")...)
	emitterAddr := freeAddr(t)
	startService(t, bin, "emitter", emitterAddr, append(common, "EMITTER_OTLP_HTTP_ADDR=off", "EMITTER_OTLP_GRPC_ADDR=off")...)

	const n = 25
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// nats.js, straight to JetStream.
	cmd := exec.CommandContext(ctx, "node", "publish.mjs", ns.ClientURL(), strconv.Itoa(n), payload)
	cmd.Dir = natsjsDir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node publish.mjs: %v\n%s", err, stderr.String())
	}
	var js struct{ IDs []string }
	if err := json.Unmarshal(out, &js); err != nil || len(js.IDs) != n {
		t.Fatalf("nats.js published %q (%v)", out, err)
	}

	// curl, to the HTTP ingest, as NDJSON.
	var ndjson bytes.Buffer
	var curlIDs []string
	for range n {
		ev := map[string]any{}
		_ = json.Unmarshal([]byte(payload), &ev)
		ev["event_id"], ev["ts"] = events.NewEventID(), time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00")
		curlIDs = append(curlIDs, ev["event_id"].(string))
		line, _ := json.Marshal(ev)
		ndjson.Write(append(line, '\n'))
	}
	// The root README's commands, run as shown, against this emitter: the events in
	// events.ndjson, then a thumbs up on the first of them.
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "events.ndjson"), ndjson.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	readmeCurl := func(path string, replace ...string) []byte {
		t.Helper()
		cmd := rootReadmeCurl(t, path)
		cmd = strings.ReplaceAll(cmd, "localhost:8080", emitterAddr)
		cmd = strings.NewReplacer(replace...).Replace(cmd)
		c := exec.CommandContext(ctx, "bash", "-c", cmd)
		c.Dir = work
		var stderr bytes.Buffer
		c.Stderr = &stderr
		out, err := c.Output()
		if err != nil {
			t.Fatalf("the README's %s: %v\n%s%s", cmd, err, out, stderr.String())
		}
		return out
	}
	out = readmeCurl("/v1/events")
	var ack struct{ Accepted, Stored, Rejected int }
	if err := json.Unmarshal(out, &ack); err != nil || ack.Accepted != n || ack.Rejected != 0 {
		t.Fatalf("ingest answered the README's curl %s", out)
	}
	out = readmeCurl("/v1/feedback", "<event_id>", curlIDs[0])
	if err := json.Unmarshal(out, &ack); err != nil || ack.Accepted != 1 || ack.Rejected != 0 {
		t.Fatalf("ingest answered the README's feedback curl %s", out)
	}

	db, err := chdb.Open(ctx, chCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ids := append(slices.Clone(js.IDs), curlIDs...)
	quoted := make([]string, len(ids))
	for i, id := range ids {
		quoted[i] = "'" + id + "'"
	}
	in := strings.Join(quoted, ",")
	deadline := time.Now().Add(90 * time.Second)
	for {
		var got, rolled uint64
		err := db.Conn().QueryRow(ctx, "SELECT count() FROM requests WHERE event_id IN ("+in+")").Scan(&got)
		if err == nil {
			err = db.Conn().QueryRow(ctx, "SELECT sum(requests) FROM token_rollups WHERE scene = ?", want["scene"]).Scan(&rolled)
		}
		var rated uint64
		if err == nil {
			err = db.Conn().QueryRow(ctx, "SELECT count() FROM feedback WHERE request_id = ? AND name = 'thumbs' AND value = 1", curlIDs[0]).Scan(&rated)
		}
		if err == nil && got == 2*n && rolled == 2*n && rated == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90 s: %d of %d events in requests, %d in token_rollups, %d of the README's thumbs up in feedback (%v)", got, 2*n, rolled, rated, err)
		}
		time.Sleep(500 * time.Millisecond)
	}

	rows, err := db.Conn().Query(ctx, "SELECT model, scene, env, input_tokens, output_tokens, ttft_ms, total_ms, status, stream FROM requests WHERE event_id IN ("+in+")")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var model, scene, env, status string
		var inTok, outTok uint32
		var ttft, total float64
		var stream uint8
		if err := rows.Scan(&model, &scene, &env, &inTok, &outTok, &ttft, &total, &status, &stream); err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprint(model, scene, env, inTok, outTok, ttft, total, status, stream == 1)
		exp := fmt.Sprint(want["model"], want["scene"], want["env"], want["input_tokens"], want["output_tokens"], want["ttft_ms"], want["total_ms"], want["status"], want["stream"])
		if got != exp {
			t.Fatalf("stored %s, want the README's %s", got, exp)
		}
	}
}

// TestReadmeSnippetsSamePayload checks that schemas/README.md's Go, Python, JavaScript and
// nats CLI snippets publish the event of its JSON example, field for field, to its subject.
func TestReadmeSnippetsSamePayload(t *testing.T) {
	_, want := readmeEvent(t)
	b, err := os.ReadFile(filepath.Join(rootDir(t), "schemas", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := func(lang string) string {
		m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindStringSubmatch(string(b))
		if m == nil {
			t.Fatalf("schemas/README.md has no ```%s block", lang)
		}
		return m[1]
	}
	goNames := map[string]string{"v": "V", "model": "Model", "scene": "Scene", "env": "Env", "input_tokens": "InputTokens",
		"output_tokens": "OutputTokens", "ttft_ms": "TTFTMs", "total_ms": "TotalMs", "status": "Status", "stream": "Stream"}
	goValue := func(k string, v any) string {
		switch x := v.(type) {
		case string:
			if k == "status" {
				return map[string]string{"ok": "events.StatusOK", "error": "events.StatusError",
					"timeout": "events.StatusTimeout", "canceled": "events.StatusCanceled"}[x]
			}
			return strconv.Quote(x)
		case bool:
			return strconv.FormatBool(x)
		}
		return fmt.Sprint(v)
	}
	pyValue := func(v any) string {
		switch x := v.(type) {
		case string:
			return strconv.Quote(x)
		case bool:
			return map[bool]string{true: "True", false: "False"}[x]
		}
		return fmt.Sprint(v)
	}
	jsonValue := func(v any) string { j, _ := json.Marshal(v); return string(j) }
	subject := events.RequestSubject(want["env"].(string), want["scene"].(string))
	for _, c := range []struct {
		lang, text string
		field      func(k string, v any) string
	}{
		{"go", block("go"), func(k string, v any) string { return goNames[k] + ": " + goValue(k, v) }},
		{"python", block("python"), func(k string, v any) string { return strconv.Quote(k) + ": " + pyValue(v) }},
		{"js", block("js"), func(k string, v any) string { return k + ": " + jsonValue(v) }},
		{"sh", block("sh"), func(k string, v any) string { return strconv.Quote(k) + ":" + jsonValue(v) }},
	} {
		for k, v := range want {
			if k == "event_id" || k == "ts" {
				continue
			}
			if f := c.field(k, v); !strings.Contains(c.text, f) {
				t.Errorf("the %s snippet lacks %s (the JSON example's %s)", c.lang, f, k)
			}
		}
		if c.lang != "go" && !strings.Contains(c.text, subject) {
			t.Errorf("the %s snippet does not publish to %s", c.lang, subject)
		}
		if !strings.Contains(c.text, "Nats-Msg-Id") && !strings.Contains(c.text, "msgID") && !strings.Contains(c.text, "MsgIDHeader") {
			t.Errorf("the %s snippet sets no Nats-Msg-Id", c.lang)
		}
	}
}

// rootReadmeCurl returns the curl command of the root README's ```sh block that posts to
// path, its continued lines joined.
func rootReadmeCurl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rootDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		cmd := strings.TrimSpace(strings.ReplaceAll(m[1], "\\\n", " "))
		if strings.HasPrefix(cmd, "curl ") && strings.Contains(cmd, "localhost:8080"+path+" ") && !strings.Contains(cmd, "\n") {
			return cmd
		}
	}
	t.Fatalf("README.md has no ```sh block with one curl command to localhost:8080%s", path)
	return ""
}
