//go:build linux

package main

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/testbed"
)

// The peer benchmarks put the emitter and other proxies (Debian's nginx) in front of the same
// fake LLM, each in its own process, and drive them in turn with the epoll load generator,
// round after round, so that what the machine's other load does to one it does to all. Each
// peer is named in BENCH_PEERS:
//
//	emitter              the emitter as configured by default
//	emitter-loops<n>     with EMITTER_RELAY_LOOPS=n
//	emitter-linger<d>    with EMITTER_PUBLISH_LINGER=d (0, 1ms, 5ms, 20ms)
//	emitter-procs<n>     with GOMAXPROCS=n
//	emitter-gogc<n>      with GOGC=n
//	emitter…@<binary>    any of these run from another test binary of this package (go test
//	                     -c), such as one built before a change, for a side-by-side A/B run
//	nginx-w<n>           nginx with worker_processes n, proxy_buffering off, a kept-alive
//	                     HTTP/1.1 upstream pool
//	caddy                Debian's Caddy, reverse_proxy with flush_interval -1, buffer_requests
//	                     and a kept-alive upstream pool
//	revproxy             net/http's floor: httputil.ReverseProxy (FlushInterval -1) on a bare
//	                     http.Server, in this test binary's child process
//	nethttp              net/http's floor without ReverseProxy: a handler that forwards the
//	                     request with http.Transport and copies the answer, flushing each read
//	floor                a bare byte relay on one epoll loop (BENCH_PROXY=floor): no HTTP
//	floor-http           the same loop doing what a measuring proxy must per request (parse
//	                     both heads and the body, meter the chunks, publish the event), built
//	                     as nginx is, with no net/http and no goroutine per request
//
// Every emitter publishes each request's event to one nats-server, in its own process too, so
// its CPU time per request is the event's cost on NATS; only one peer is driven at a time.

// peer is one proxy under test.
type peer struct {
	name    string
	addr    string // host:port it serves on
	emitter bool   // serves /metrics
	pprof   string // an emitter's profiles and /debug/settle
	pids    func() []int
}

// cpu is the CPU time the peer's processes have used.
func (p *peer) cpu(b testing.TB) time.Duration {
	var sum time.Duration
	for _, pid := range p.pids() {
		d, ok := testbed.ProcessCPU(pid)
		if !ok {
			b.Fatalf("cannot read the CPU time of %s (pid %d)", p.name, pid)
		}
		sum += d
	}
	return sum
}

// sysCPU is the CPU time the peer's processes have spent in the kernel.
func (p *peer) sysCPU(b testing.TB) time.Duration {
	var sum time.Duration
	for _, pid := range p.pids() {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := strings.LastIndexByte(string(st), ')')
		if err != nil || i < 0 {
			b.Fatalf("cannot read the CPU time of %s (pid %d): %v", p.name, pid, err)
		}
		f := strings.Fields(string(st[i+1:]))
		ticks, err := strconv.ParseInt(f[12], 10, 64) // stime, the 15th field
		if err != nil {
			b.Fatalf("cannot read the CPU time of %s (pid %d): %v", p.name, pid, err)
		}
		sum += time.Duration(ticks) * 10 * time.Millisecond // USER_HZ is 100 on Linux
	}
	return sum
}

// perfCount counts, with perf stat (BENCH_PERF=1), the system calls and context switches of
// the processes pids from now until the function it returns is called.
func perfCount(b testing.TB, pids []int) func() map[string]float64 {
	var list []string
	for _, pid := range pids {
		list = append(list, strconv.Itoa(pid))
	}
	out := filepath.Join(b.TempDir(), "perf.csv")
	cmd := exec.Command("perf", "stat", "-x,", "-o", out, "-e", "raw_syscalls:sys_enter,context-switches", "-p", strings.Join(list, ","))
	if err := cmd.Start(); err != nil {
		b.Fatalf("BENCH_PERF=1: cannot start perf (apt-get install -y linux-perf): %v", err)
	}
	time.Sleep(200 * time.Millisecond) // attached
	return func() map[string]float64 {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		raw, err := os.ReadFile(out)
		if err != nil {
			b.Fatalf("BENCH_PERF=1: perf wrote nothing: %v", err)
		}
		got := map[string]float64{}
		for _, line := range strings.Split(string(raw), "\n") {
			f := strings.Split(line, ",")
			if len(f) < 3 {
				continue
			}
			v, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				continue
			}
			switch f[2] {
			case "raw_syscalls:sys_enter":
				got["syscalls"] = v
			case "context-switches":
				got["ctxsw"] = v
			}
		}
		return got
	}
}

// rss is the resident set of the peer's processes, in bytes.
func (p *peer) rss(b testing.TB) float64 {
	var sum float64
	for _, pid := range p.pids() {
		rss, ok := processRSS(pid)
		if !ok {
			b.Fatalf("cannot read the resident set of %s (pid %d)", p.name, pid)
		}
		sum += rss
	}
	return sum
}

// benchPeers reads BENCH_PEERS, skipping the benchmark when it is not set. A peer whose
// program is not installed is left out, and said so; the benchmark is skipped when none is left.
func benchPeers(b *testing.B) []string {
	v := os.Getenv("BENCH_PEERS")
	if v == "" {
		b.Skip(`set BENCH_PEERS, such as "emitter nginx-w1 nginx-w2 caddy nethttp" (make bench-peers)`)
	}
	var names []string
	for _, name := range strings.Fields(v) {
		if why := peerMissing(name); why != "" {
			b.Logf("BENCH_PEERS: leaving %s out: %s", name, why)
			continue
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		b.Skip("BENCH_PEERS: none of the peers named is installed")
	}
	return names
}

// peerMissing says what is missing to run the peer name, or "" when nothing is.
func peerMissing(name string) string {
	switch {
	case strings.HasPrefix(name, "nginx-w"):
		if nginxBinary() == "" {
			return "nginx is not installed: apt-get install -y nginx-light"
		}
	case name == "caddy":
		if _, err := exec.LookPath("caddy"); err != nil {
			return "caddy is not installed: apt-get install -y caddy"
		}
	}
	return ""
}

// nginxBinary is nginx's path, "" when it is not installed.
func nginxBinary() string {
	if bin, err := exec.LookPath("nginx"); err == nil {
		return bin
	}
	if _, err := os.Stat("/usr/sbin/nginx"); err == nil {
		return "/usr/sbin/nginx" // not on a user's PATH
	}
	return ""
}

// startPeers starts each peer named, in front of upstream (host:port), the emitters
// publishing to natsURL; env is added to every emitter's environment.
func startPeers(b *testing.B, names []string, natsURL, upstream string, env ...string) []*peer {
	var peers []*peer
	for _, name := range names {
		switch {
		case strings.HasPrefix(name, "nginx-w"):
			workers, err := strconv.Atoi(strings.TrimPrefix(name, "nginx-w"))
			if err != nil || workers < 1 {
				b.Fatalf("BENCH_PEERS: %q: want nginx-w<workers>", name)
			}
			peers = append(peers, startNginx(b, name, workers, upstream))
		case name == "caddy":
			peers = append(peers, startCaddy(b, upstream))
		case name == "revproxy" || name == "nethttp" || name == "floor" || name == "floor-http":
			c, pprof := startChildAs(b, name, natsURL, "http://"+upstream, env...)
			peers = append(peers, &peer{name: name, addr: strings.TrimPrefix(c.base, "http://"), pprof: pprof,
				pids: func() []int { return []int{c.pid} }})
		case strings.HasPrefix(name, "emitter"):
			penv := append([]string{"EMITTER_STREAM_IDLE_TIMEOUT=1h"}, env...)
			kind, bin, other := strings.Cut(name, "@")
			if !other {
				bin = os.Args[0]
			}
			switch rest := strings.TrimPrefix(kind, "emitter"); {
			case rest == "":
			case strings.HasPrefix(rest, "-loops"):
				penv = append(penv, "EMITTER_RELAY_LOOPS="+strings.TrimPrefix(rest, "-loops"))
			case strings.HasPrefix(rest, "-procs"):
				penv = append(penv, "GOMAXPROCS="+strings.TrimPrefix(rest, "-procs"))
			case strings.HasPrefix(rest, "-linger"):
				penv = append(penv, "EMITTER_PUBLISH_LINGER="+strings.TrimPrefix(rest, "-linger"))
			case strings.HasPrefix(rest, "-gogc"):
				penv = append(penv, "GOGC="+strings.TrimPrefix(rest, "-gogc"))
			default:
				b.Fatalf("BENCH_PEERS: %q: want emitter, emitter-loops<n>, emitter-linger<duration>, emitter-procs<n> or emitter-gogc<n>", name)
			}
			c, pprof := startChildFrom(b, bin, "serve", natsURL, "http://"+upstream, penv...)
			peers = append(peers, &peer{name: name, addr: strings.TrimPrefix(c.base, "http://"), emitter: true, pprof: pprof,
				pids: func() []int { return []int{c.pid} }})
		default:
			b.Fatalf("BENCH_PEERS: unknown peer %q", name)
		}
	}
	return peers
}

// startNATSProcess starts a nats-server with JetStream in its own process (this test binary,
// TestMain's nats mode) and returns its URL and pid.
func startNATSProcess(b *testing.B) (url string, pid int) {
	addr := freeAddr(b)
	_, port, _ := strings.Cut(addr, ":")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "EMITTER_TEST_CHILD=nats", "NATS_PORT="+port, "NATS_STORE="+b.TempDir())
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitListening(b, addr)
	return "nats://" + addr, cmd.Process.Pid
}

// nginxConf is the configuration of the nginx peer: a streaming reverse proxy as one would
// put in front of an inference server, buffering off and upstream connections kept alive.
const nginxConf = `daemon off;
master_process on;
worker_processes %d;
worker_rlimit_nofile 20000;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 16000; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 600s;
  upstream llm {
    server %[3]s;
    keepalive 1024;
    keepalive_requests 1000000;
    keepalive_timeout 600s;
  }
  server {
    listen %[4]s;
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 1h;
    }
  }
}
`

// startNginx starts Debian's nginx with workers worker processes in front of upstream,
// configured in a temporary directory (benchPeers has left it out when nginx is not installed).
func startNginx(b *testing.B, name string, workers int, upstream string) *peer {
	bin := nginxBinary()
	dir := b.TempDir()
	addr := freeAddr(b)
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, workers, dir, upstream, addr), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("cannot start nginx: %v", err)
	}
	b.Cleanup(func() { stopGracefully(cmd) })
	waitListening(b, addr)
	master := cmd.Process.Pid
	var procs []int
	for deadline := time.Now().Add(10 * time.Second); len(procs) < workers+1; time.Sleep(50 * time.Millisecond) {
		procs = append([]int{master}, childrenOf(master)...)
		if time.Now().After(deadline) {
			b.Fatalf("nginx started %d of %d workers", len(procs)-1, workers)
		}
	}
	return &peer{name: name, addr: addr, pids: func() []int { return procs }}
}

// caddyConf is the configuration of the Caddy peer, set up like nginx's: a streaming reverse
// proxy (flush_interval -1: every write flushed), the request body read before it goes
// upstream (buffer_requests, as nginx's proxy_request_buffering does by default), upstream
// connections kept alive, no access log, no admin endpoint, no TLS.
const caddyConf = `{
	admin off
	auto_https off
	log {
		level ERROR
	}
}
http://%[1]s {
	reverse_proxy %[2]s {
		flush_interval -1
		buffer_requests
		transport http {
			keepalive 600s
			keepalive_idle_conns 1024
			keepalive_idle_conns_per_host 1024
		}
	}
}
`

// startCaddy starts Debian's Caddy in front of upstream, configured and storing in a
// temporary directory (benchPeers has left it out when Caddy is not installed).
func startCaddy(b *testing.B, upstream string) *peer {
	bin, _ := exec.LookPath("caddy")
	dir := b.TempDir()
	addr := freeAddr(b)
	conf := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(conf, fmt.Appendf(nil, caddyConf, addr, upstream), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("cannot start caddy: %v", err)
	}
	b.Cleanup(func() { stopGracefully(cmd) })
	waitListening(b, addr)
	pid := cmd.Process.Pid
	return &peer{name: "caddy", addr: addr, pids: func() []int { return []int{pid} }}
}

// stopGracefully interrupts cmd and kills it if it has not exited within five seconds: on
// an interrupt Caddy stops listening and waits for every open request, and a held stream
// whose client has left stays open upstream.
func stopGracefully(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(os.Interrupt)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	dirs, _ := os.ReadDir("/proc")
	var out []int
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(st), ')')
		if f := strings.Fields(string(st[i+1:])); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, child)
		}
	}
	return out
}

// peerFigures is what one round measured of one peer.
type peerFigures map[string]float64

// BenchmarkPeers drives each peer of BENCH_PEERS and, side by side, the fake LLM directly,
// at each rate of BENCH_RATES (default 250,500,1000), BENCH_ROUNDS times (default 4), the
// peers in turn within a round (in the opposite order every other round), and reports per
// round the added TTFT and total (p50, p99, through minus direct), the peer's CPU time per
// request, nats-server's per request (one event each, the emitters'), and the rate kept.
// After the rounds of a rate it logs each figure's median and range per peer, and the ratio
// of the first peer's CPU and added p99 to each other peer's, round by round.
// Streaming chat completions of BENCH_TOKENS tokens (default 20), TTFT 50 ms, TPOT 5 ms.
// Run it with -benchtime=4000x (requests per peer and round); make bench-peers does.
func BenchmarkPeers(b *testing.B) {
	names := benchPeers(b)
	tokens := 20
	if v := os.Getenv("BENCH_TOKENS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_TOKENS=%q: want a count of tokens", v)
		}
		tokens = n
	}
	rates := benchRates(b, []int{250, 500, 1000})
	rounds := 4
	if v := os.Getenv("BENCH_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_ROUNDS=%q: want a count", v)
		}
		rounds = n
	}
	natsURL, natsPid := startNATSProcess(b)
	const ttft = 50 * time.Millisecond
	fake := startEpollFake(b, ttft, 5*time.Millisecond, tokens)
	peers := startPeers(b, names, natsURL, fake.addr, strings.Fields(os.Getenv("BENCH_EMITTER_ENV"))...)
	for _, rate := range rates {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) {
			got := map[string][]peerFigures{}
			for _, p := range peers {
				got[p.name] = make([]peerFigures, rounds)
			}
			for round := range rounds {
				order := slices.Clone(peers)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, p := range order {
					b.Run(fmt.Sprintf("peer=%s/round=%d", p.name, round+1), func(b *testing.B) {
						// The framework runs it with b.N = 1 first: the last run counts.
						got[p.name][round] = peerRound(b, p, fake.addr, natsPid, time.Second/time.Duration(rate))
					})
				}
			}
			logPeerSummary(b, names, got, 3*ttft)
		})
	}
}

// benchRates reads BENCH_RATES, such as 1000,500,250.
func benchRates(b *testing.B, def []int) []int {
	v := os.Getenv("BENCH_RATES")
	if v == "" {
		return def
	}
	var rates []int
	for _, f := range strings.Split(v, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r <= 0 {
			b.Fatalf("BENCH_RATES=%q: %q is not a rate", v, f)
		}
		rates = append(rates, r)
	}
	return rates
}

// peerRound sends b.N streaming requests through p and as many straight to the fake at
// direct, one of each every interval, on kept-alive connections warmed first.
func peerRound(b *testing.B, p *peer, direct string, natsPid int, every time.Duration) peerFigures {
	body := `{"model":"gpt-4o","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"measure the proxy"}]}`
	c := newEpollClient(b, []string{p.addr, direct}, body)
	if err := c.warm(100); err != nil {
		b.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the warm-up's events published
	var counted func() map[string]float64
	if os.Getenv("BENCH_PERF") == "1" {
		counted = perfCount(b, p.pids())
	}
	cpu0, nats0, self0 := p.cpu(b), cpuTime(b, natsPid), cpuTime(b, os.Getpid())
	sys0 := p.sysCPU(b)
	prof := profileRound(b, p, time.Duration(b.N)*every)
	b.ResetTimer()
	sent := c.run(b.N, every)
	b.StopTimer()
	prof()
	self := cpuTime(b, os.Getpid()) - self0
	time.Sleep(50 * time.Millisecond) // the last events published, after the longest linger
	cpu, nats, sys := p.cpu(b)-cpu0, cpuTime(b, natsPid)-nats0, p.sysCPU(b)-sys0
	via, dir := c.targets[0], c.targets[1]
	if via.failures+dir.failures > 0 || len(via.results) != b.N || len(dir.results) != b.N {
		b.Fatalf("%d of %d requests through %s and %d direct finished, %d and %d failed: %s",
			len(via.results), b.N, p.name, len(dir.results), via.failures, dir.failures, strings.Join(c.errs, "; "))
	}
	vt, vtot := splitTimings(via.results)
	dt, dtot := splitTimings(dir.results)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	perReq := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	f := peerFigures{
		"added-ttft-p50-ms":    ms(pct(vt, .5) - pct(dt, .5)),
		"added-ttft-p99-ms":    ms(pct(vt, .99) - pct(dt, .99)),
		"added-total-p50-ms":   ms(pct(vtot, .5) - pct(dtot, .5)),
		"added-total-p99-ms":   ms(pct(vtot, .99) - pct(dtot, .99)),
		"direct-ttft-p99-ms":   ms(pct(dt, .99)),
		"req/s":                float64(b.N) / sent.Seconds(),
		"proxy-cpu-us/req":     perReq(cpu),
		"proxy-sys-cpu-us/req": perReq(sys),
		"nats-cpu-us/req":      perReq(nats),
		"harness-cpu-us/pair":  perReq(self),
	}
	if counted != nil {
		for k, v := range counted() {
			f["proxy-"+k+"/req"] = v / float64(b.N)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(f)) {
		b.ReportMetric(f[k], k)
	}
	return f
}

// profileRound saves, under BENCH_PROFILE_DIR, the CPU profile of a Go peer (the emitter, the
// net/http floors) over the round about to run for d, as <peer>-rate<r>-round<n>.pb.gz; the
// function it returns waits for it. The profiler costs the peer 1-3 % more CPU: compare the
// CPU figures of rounds run without it.
func profileRound(b *testing.B, p *peer, d time.Duration) (wait func()) {
	dir := os.Getenv("BENCH_PROFILE_DIR")
	secs := int(d.Seconds()) - 1
	if dir == "" || p.pprof == "" || secs < 1 {
		return func() {}
	}
	// b.Name() is BenchmarkPeers/rate=250/peer=emitter/round=1.
	name := strings.NewReplacer("BenchmarkPeers/", "", "/", "-", "=", "").Replace(b.Name())
	done := make(chan error, 1)
	go func() {
		done <- fetch(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.pprof, secs), filepath.Join(dir, name+".pb.gz"))
	}()
	return func() {
		if err := <-done; err != nil {
			b.Errorf("cannot save the CPU profile of %s: %v", p.name, err)
		}
	}
}

func splitTimings(ts []timing) (ttft, total []time.Duration) {
	for _, t := range ts {
		ttft, total = append(ttft, t.ttft), append(total, t.total)
	}
	return ttft, total
}

// logPeerSummary logs, per figure, each peer's median and range over the rounds, and the
// first peer's CPU time and added latencies over each other peer's, as median and range of
// the round-by-round ratios; then, when some rounds were not clean, the same over the clean
// rounds only. A round is clean when the direct path's p99 TTFT stayed under limit: on a
// shared machine a burst of someone else's work stalls every process for hundreds of
// milliseconds, and the round then measures the stall; past the machine's capacity no round
// is clean, and the figures of all rounds measure the queueing.
func logPeerSummary(b *testing.B, names []string, got map[string][]peerFigures, limit time.Duration) {
	clean := map[string][]peerFigures{}
	unclean := 0
	for _, n := range names {
		for _, f := range got[n] {
			if f != nil && f["direct-ttft-p99-ms"] > float64(limit.Milliseconds()) {
				f, unclean = nil, unclean+1
			}
			clean[n] = append(clean[n], f)
		}
	}
	b.Log("\n" + peerTable(names, got, "all rounds"))
	if unclean > 0 {
		b.Log("\n" + peerTable(names, clean, fmt.Sprintf("the clean rounds (direct p99 TTFT under %s)", limit)))
	}
}

// peerTable is the summary of logPeerSummary over the rounds of got that are not nil.
func peerTable(names []string, got map[string][]peerFigures, which string) string {
	num := func(v float64) string {
		switch a := max(v, -v); {
		case a >= 100:
			return strconv.FormatFloat(v, 'f', 0, 64)
		case a >= 10:
			return strconv.FormatFloat(v, 'f', 1, 64)
		default:
			return strconv.FormatFloat(v, 'f', 2, 64)
		}
	}
	spread := func(v []float64) string {
		v = slices.Clone(v)
		slices.Sort(v)
		return fmt.Sprintf("%s (%s to %s)", num(v[len(v)/2]), num(v[0]), num(v[len(v)-1]))
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "median (range) over %s\n| figure | %s |\n| --- |%s\n",
		which, strings.Join(names, " | "), strings.Repeat(" --- |", len(names)))
	fmt.Fprintf(&sb, "| rounds |")
	var keys []string
	for _, n := range names {
		k := 0
		for _, f := range got[n] {
			if f != nil {
				k++
				if keys == nil {
					keys = slices.Sorted(maps.Keys(f))
				}
			}
		}
		fmt.Fprintf(&sb, " %d of %d |", k, len(got[n]))
	}
	sb.WriteString("\n")
	for _, k := range keys {
		fmt.Fprintf(&sb, "| %s |", k)
		for _, n := range names {
			var v []float64
			for _, f := range got[n] {
				if f != nil {
					v = append(v, f[k])
				}
			}
			if len(v) == 0 {
				sb.WriteString(" |")
				continue
			}
			fmt.Fprintf(&sb, " %s |", spread(v))
		}
		sb.WriteString("\n")
	}
	for _, other := range names[1:] {
		for _, k := range []string{"proxy-cpu-us/req", "nats-cpu-us/req", "added-ttft-p99-ms", "added-total-p99-ms", "added-ttft-p50-ms"} {
			var r []float64
			for i, f := range got[names[0]] {
				if f != nil && i < len(got[other]) && got[other][i] != nil && got[other][i][k] != 0 {
					r = append(r, f[k]/got[other][i][k])
				}
			}
			if len(r) > 0 {
				fmt.Fprintf(&sb, "%s / %s, %s: %s, %d rounds\n", names[0], other, k, spread(r), len(r))
			}
		}
	}
	return sb.String()
}

// BenchmarkPeerStreams holds BENCH_STREAMS streams (default 2000) open through each peer of
// BENCH_PEERS, whose upstream sends its next token only after an hour, and reports the
// resident set per held stream: the difference from a baseline taken after 50 streams opened
// and closed, divided by the streams, once they are all open (and, for the emitter, have left
// net/http), with BENCH_OPEN_HOLD=d also after d more with nothing forced (held-rss-KB/stream),
// and for the emitter once it collected its garbage (settled-rss-KB/stream).
// The peers run in fresh processes, one after the other. Run it with -benchtime=1x.
func BenchmarkPeerStreams(b *testing.B) {
	names := benchPeers(b)
	streams := 2000
	if v := os.Getenv("BENCH_STREAMS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("BENCH_STREAMS=%q: want a count", v)
		}
		streams = n
	}
	for _, name := range names {
		b.Run("peer="+name, func(b *testing.B) {
			natsURL, _ := startNATSProcess(b)
			fake := startEpollFake(b, 0, time.Hour, 2)
			p := startPeers(b, []string{name}, natsURL, fake.addr)[0]
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}}
			defer client.CloseIdleConnections()
			base := "http://" + p.addr
			body := `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hold on"}]}`
			holdStreams(b, client, base, body, 50)()
			if p.emitter {
				settle(b, p.pprof)
			}
			before := p.rss(b)
			release := holdStreams(b, client, base, body, streams)
			b.Cleanup(release)
			time.Sleep(time.Second)
			if p.emitter {
				waitMetric(b, base, "emitter_proxy_parked_streams", float64(streams), 30*time.Second)
			}
			for b.Loop() {
			}
			b.ReportMetric((p.rss(b)-before)/float64(streams)/1024, "rss-KB/stream")
			if v := os.Getenv("BENCH_OPEN_HOLD"); v != "" {
				// Hold the streams longer with nothing forced: the Go runtime's own collection
				// and scavenger run as they do in a service.
				d, err := time.ParseDuration(v)
				if err != nil {
					b.Fatalf("BENCH_OPEN_HOLD=%q: %v", v, err)
				}
				time.Sleep(d)
				b.ReportMetric((p.rss(b)-before)/float64(streams)/1024, "held-rss-KB/stream")
			}
			if p.emitter {
				settle(b, p.pprof)
				b.ReportMetric((p.rss(b)-before)/float64(streams)/1024, "settled-rss-KB/stream")
			}
			b.ReportMetric(float64(streams), "streams")
		})
	}
}
