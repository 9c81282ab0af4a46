package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

// claudeDir holds the Node project that installs the Claude Code CLI (@anthropic-ai/claude-code,
// a native binary) for TestClaudeCode; scripts/test.sh runs `npm ci` there.
const claudeDir = "testdata/claude"

// claudeEnv keeps the CLI on the proxy: without it, it also calls api.anthropic.com
// (telemetry, error reports, update checks) whatever ANTHROPIC_BASE_URL says.
var claudeEnv = []string{"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}

// claudeBinary is the CLI installed in claudeDir, else the claude on the PATH; it skips the
// test when there is none (fails under CI=true).
func claudeBinary(t *testing.T) string {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join(claudeDir, "node_modules", ".bin", "claude"))
	if err == nil {
		if _, err = os.Stat(bin); err == nil {
			return bin
		}
	}
	if p, perr := exec.LookPath("claude"); perr == nil {
		return p
	}
	msg := "the Claude Code CLI is not installed (" + err.Error() + "): scripts/test.sh installs it, or run: cd services/emitter/" + claudeDir + " && npm ci"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// TestClaudeCode runs `claude -p "hi"` against the proxy in front of the fake LLM: it exits
// 0 with the fake's answer, its requests become events, and it calls nothing but the proxy
// (every other connection goes to an HTTPS proxy that refuses and records it).
func TestClaudeCode(t *testing.T) {
	bin := claudeBinary(t)
	base, js, stop := serveRigWith(t, fakellm.Options{Tokens: 8})
	defer stop()
	elsewhere := refusingProxy(t)

	home := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-p", "hi")
	cmd.Dir = home
	cmd.Env = append([]string{"HOME=" + home, "PATH=" + os.Getenv("PATH"), "TERM=dumb",
		"ANTHROPIC_BASE_URL=" + base, "ANTHROPIC_API_KEY=sk-ant-test-not-a-key",
		"HTTPS_PROXY=" + elsewhere.url, "HTTP_PROXY=" + elsewhere.url, "NO_PROXY=127.0.0.1,localhost"}, claudeEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("claude -p hi: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	if strings.TrimSpace(stdout.String()) == "" {
		t.Fatalf("claude -p hi printed nothing; stderr:\n%s", stderr.String())
	}
	if hosts := elsewhere.hosts(); len(hosts) > 0 {
		t.Errorf("the CLI tried to reach %v beside the proxy", hosts)
	}
	waitMsgs(t, js, 1)
	t.Logf("claude -p hi: %q", strings.TrimSpace(stdout.String()))
}

// proxyRecorder is an HTTP(S) proxy that answers every request 403 and keeps the hosts asked for.
type proxyRecorder struct {
	url  string
	mu   sync.Mutex
	seen []string
}

func (p *proxyRecorder) hosts() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

func refusingProxy(t *testing.T) *proxyRecorder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxyRecorder{url: "http://" + ln.Addr().String()}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				p.mu.Lock()
				p.seen = append(p.seen, req.Host)
				p.mu.Unlock()
				_, _ = c.Write([]byte("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return p
}
