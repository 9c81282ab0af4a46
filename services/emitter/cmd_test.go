package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/testbed"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
)

func TestBenchCommand(t *testing.T) {
	fake := httptest.NewServer(fakellm.New(fakellm.Options{TTFT: time.Millisecond}))
	defer fake.Close()
	dir := t.TempDir()
	first, second := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	// A key in the URL (a query parameter) stays out of the saved result.
	args := []string{"bench", "-url", fake.URL + "?key=sk-secret", "-protocol", "anthropic", "-publish=false", "-requests", "3", "-prompts", "short=20,long=2000", "-max-tokens", "4"}
	var out bytes.Buffer
	if err := run(context.Background(), append(args, "-out", first), nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), append(args, "-out", second, "-compare", first), nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"TTFT p50", "2000-7999", "Δ", "result written to " + second} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	saved, err := os.ReadFile(second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(saved), "sk-secret") || !strings.Contains(string(saved), fake.URL) {
		t.Fatalf("the result saves the endpoint with its key, or not at all:\n%.300s", saved)
	}
	err = run(context.Background(), []string{"bench", "-protocol", "grpc"}, nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-protocol") {
		t.Fatalf("bad protocol: %v", err)
	}
}

func TestReplayCommandPublishes(t *testing.T) {
	ns := testbed.NATS(t)
	var out bytes.Buffer
	err := run(context.Background(), []string{"replay", "-simulate", "-duration", "1m", "-limit", "40", "-speed", "1000", "-seed", "3",
		"-incident", "start=0s,for=10s,ttft=3"}, []string{"NATS_URL=" + ns.ClientURL()}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "sent 40") || !strings.Contains(out.String(), "unpublished 0") {
		t.Fatalf("output %q", out.String())
	}
	nc, js := connectJS(t, ns.ClientURL())
	defer nc.Close()
	waitMsgs(t, js, 40)

	for _, bad := range [][]string{{"replay", "-speed", "0"}, {"replay", "-shape", "chat"}, {"replay", "-incident", "start=1m"}, {"replay", "-trace", "/nonexistent.csv"}} {
		if err := run(context.Background(), bad, nil, io.Discard, io.Discard); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	// Refused before anything runs, NATS or not: numbers that are not numbers, or that the
	// model cannot use.
	for _, bad := range [][]string{{"-speed", "NaN"}, {"-speed", "+Inf"}, {"-model-queue", "NaN"}, {"-model-decode", "-1"},
		{"-model-errors", "NaN"}, {"-model-errors", "2"}, {"-model-ttft", "-1s"}, {"-model-tpot", "-1ms"}, {"-feedback", "NaN"},
		{"-turns", "NaN"}, {"-turns", "0.5"}, {"-turns", "51"}} {
		args := append([]string{"replay", "-simulate", "-publish=false", "-duration", "10s", "-limit", "3"}, bad...)
		if err := run(context.Background(), args, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Errorf("%v: error %v, want one naming %s", bad, err, bad[0])
		}
	}
}

// TestReplayBurstFlags: -burst is read as the demo's incident spec, its errors name the
// flag and the bad part, and each kind of incident goes with its kind of load only.
func TestReplayBurstFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"-burst", "clients=0"}, []string{"-burst", "clients=0"}},
		{[]string{"-burst", "every=10s"}, []string{"-burst", "every=10s must be longer than for=40s"}},
		{[]string{"-burst", "at=soon"}, []string{"-burst", `at="soon"`}},
		{[]string{"-burst", "start=1m,for=1m"}, []string{"-burst", `unknown part "start"`}},
		{[]string{"-simulate", "-burst", "at=1m"}, []string{"-burst", "-simulate"}},
		{[]string{"-incident", "start=0s,for=1m,ttft=4"}, []string{"-incident", "-simulate", "-burst"}},
	} {
		args := append([]string{"replay", "-publish=false", "-duration", "10s", "-limit", "3", "-url", "http://127.0.0.1:1"}, tt.args...)
		err := run(context.Background(), args, nil, io.Discard, io.Discard)
		for _, w := range tt.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %v, want one naming %s", tt.args, err, w)
			}
		}
	}
}

func TestReplayRealTrace(t *testing.T) {
	path := testbed.Trace(t, "AzureLLMInferenceTrace_code.csv")
	var out bytes.Buffer
	err := run(context.Background(), []string{"replay", "-trace", path, "-simulate", "-publish=false", "-limit", "500", "-speed", "100000"}, nil, &out, io.Discard)
	if err != nil || !strings.Contains(out.String(), "sent 500") {
		t.Fatalf("%v %q", err, out.String())
	}
}

func TestUnknownCommand(t *testing.T) {
	if err := run(context.Background(), []string{"frobnicate"}, nil, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Fatalf("error %v", err)
	}
}

// TestCommandsHideEndpointSecrets: a bad or unreachable endpoint given to bench or fakellm,
// with a password, a token as its user or a key in its query, is never shown with them: not
// in an error, the output or the saved result.
func TestCommandsHideEndpointSecrets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, endpoint := range []string{"ftp://user:sk-secret@h:4318", "https://sk-secret@h:port", "ftp://h/?token=sk-secret", "user:sk-secret@h:4318"} {
		err := runFakeLLM(context.Background(), []string{"-addr", "127.0.0.1:0", "-otlp-endpoint", endpoint}, nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-otlp-endpoint") || strings.Contains(err.Error(), "sk-secret") {
			t.Errorf("fakellm -otlp-endpoint %s: error %v: want one naming the flag without the secret", endpoint, err)
		}
	}
	path := filepath.Join(t.TempDir(), "r.json")
	var out, stderr bytes.Buffer
	err = run(context.Background(), []string{"bench", "-url", "http://user:sk-secret@" + closed + "/v1?api_key=sk-secret", "-publish=false",
		"-requests", "1", "-prompts", "short=4", "-max-tokens", "2", "-timeout", "2s", "-out", path}, nil, &out, &stderr)
	saved, _ := os.ReadFile(path)
	all := fmt.Sprint(err) + out.String() + stderr.String() + string(saved)
	if !strings.Contains(string(saved), closed) || strings.Contains(all, "sk-secret") {
		t.Fatalf("bench against an unreachable endpoint: %v\n%s\n%s\n%s", err, out.String(), stderr.String(), saved)
	}
}
