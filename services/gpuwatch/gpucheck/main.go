package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tokenscope/tokenscope/pkg/events"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	ok, err := check(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func check(ctx context.Context, args []string) (bool, error) {
	fs := flag.NewFlagSet("gpucheck", flag.ContinueOnError)
	gpuwatch := fs.String("gpuwatch", "./gpuwatch", "the gpuwatch binary to check")
	load := fs.String("load", "python3 matmul.py", "the command that loads every GPU; it gets the seconds to run as its last argument")
	total := fs.Duration("duration", 20*time.Second, "how long gpuwatch runs")
	idle := fs.Duration("idle", 6*time.Second, "how long the GPUs idle before the load starts")
	settle := fs.Duration("settle", 3*time.Second, "how long after the load starts its samples count as loaded")
	interval := fs.Duration("interval", 500*time.Millisecond, "GPUWATCH_INTERVAL")
	source := fs.String("source", events.SourceNVML, "GPUWATCH_SOURCE; anything but nvml only tries the check itself out")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	dir, err := os.MkdirTemp("", "gpucheck")
	if err != nil {
		return false, fmt.Errorf("cannot make a temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)

	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return false, fmt.Errorf("cannot create nats-server: %w", err)
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(15 * time.Second) {
		return false, fmt.Errorf("nats-server did not start in 15s")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return false, fmt.Errorf("cannot connect to the in-process NATS: %w", err)
	}
	defer nc.Close()
	var mu sync.Mutex
	var msgs []message
	sub, err := nc.Subscribe(events.SubjectGPUSamplesAll, func(m *nats.Msg) {
		var s events.GPUSample
		if events.UnmarshalGPUSample(m.Data, &s) != nil {
			s = events.GPUSample{} // counted invalid by evaluate
		}
		mu.Lock()
		msgs = append(msgs, message{raw: append([]byte(nil), m.Data...), sample: s})
		mu.Unlock()
	})
	if err != nil {
		return false, fmt.Errorf("cannot subscribe: %w", err)
	}
	defer sub.Unsubscribe()

	httpAddr, err := freeAddr()
	if err != nil {
		return false, err
	}
	runCtx, cancel := context.WithTimeout(ctx, *total)
	defer cancel()
	gw := exec.Command(*gpuwatch)
	gw.Env = append(os.Environ(),
		"NATS_URL="+ns.ClientURL(), "HTTP_ADDR="+httpAddr, "GPUWATCH_HOST=gpucheck",
		"GPUWATCH_INTERVAL="+interval.String(), "GPUWATCH_SOURCE="+*source)
	gw.Stdout, gw.Stderr = os.Stdout, os.Stderr
	fmt.Printf("gpucheck: running %s for %s (interval %s); load from %s on: %s\n", *gpuwatch, *total, *interval, *idle, *load)
	if err := gw.Start(); err != nil {
		return false, fmt.Errorf("cannot start gpuwatch: %w", err)
	}
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.Wait() }()

	select {
	case <-time.After(*idle):
	case err := <-gwDone:
		return false, fmt.Errorf("gpuwatch exited during the idle phase: %v", err)
	case <-runCtx.Done():
		return false, runCtx.Err()
	}
	loadFrom := time.Now()
	loadSecs := strconv.Itoa(int((*total - *idle).Seconds()) + 2)
	parts := strings.Fields(*load)
	loadCmd := exec.Command(parts[0], append(parts[1:], loadSecs)...)
	loadCmd.Stdout, loadCmd.Stderr = os.Stdout, os.Stderr
	if err := loadCmd.Start(); err != nil {
		return false, fmt.Errorf("cannot start the load %q: %w", *load, err)
	}
	defer func() {
		_ = loadCmd.Process.Kill()
		_ = loadCmd.Wait()
	}()

	var metrics string
	select {
	case <-runCtx.Done():
	case err := <-gwDone:
		return false, fmt.Errorf("gpuwatch exited under load: %v", err)
	}
	metrics, err = scrape("http://" + httpAddr + "/metrics")
	if err != nil {
		return false, err
	}
	_ = gw.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-gwDone:
		if err != nil {
			return false, fmt.Errorf("gpuwatch did not stop cleanly: %w", err)
		}
	case <-time.After(15 * time.Second):
		_ = gw.Process.Kill()
		return false, fmt.Errorf("gpuwatch did not stop 15s after SIGTERM")
	}
	_ = nc.Flush()

	mu.Lock()
	defer mu.Unlock()
	results := evaluate(msgs, *source, loadFrom, *settle, unsupportedReadings(metrics))
	allOK := true
	fmt.Println("gpucheck results:")
	for _, r := range results {
		mark := "PASS"
		if !r.ok {
			mark, allOK = "FAIL", false
		}
		fmt.Printf("  %s  %s: %s\n", mark, r.name, r.detail)
	}
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "DCGM_FI_") || strings.HasPrefix(line, "gpuwatch_nvml_") || strings.HasPrefix(line, "gpuwatch_tick_lateness_seconds_") {
			fmt.Println("  metric", line)
		}
	}
	if allOK {
		fmt.Println("gpucheck: PASS")
	} else {
		fmt.Println("gpucheck: FAIL")
	}
	return allOK, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cannot find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", fmt.Errorf("cannot scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String(), sc.Err()
}

var supportedLine = regexp.MustCompile(`^gpuwatch_nvml_reading_supported\{gpu="(\d+)",reading="([a-z_]+)"\} 0$`)

// unsupportedReadings reads, from gpuwatch's /metrics, the readings it found unsupported.
func unsupportedReadings(metrics string) map[int][]string {
	out := map[int][]string{}
	for _, line := range strings.Split(metrics, "\n") {
		if m := supportedLine.FindStringSubmatch(line); m != nil {
			g, _ := strconv.Atoi(m[1])
			out[g] = append(out[g], m[2])
		}
	}
	return out
}
