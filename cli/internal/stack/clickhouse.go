package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chserver"
)

// InstallClickHouse is how to get clickhouse-server on Debian.
const InstallClickHouse = "sudo apt-get update && sudo " + chserver.InstallHint

// ErrNoClickHouse means no clickhouse-server binary was found.
var ErrNoClickHouse = chserver.ErrNotInstalled

// ClickHouse is a private clickhouse-server process with its data in Dir.
type ClickHouse struct {
	Addr     string // native protocol
	HTTPAddr string
	Dir      string
	Log      string // the server's error log
	proc     *Proc
}

// ClickHouseCommand finds the server: clickhouse-server, or the single clickhouse binary.
func ClickHouseCommand() ([]string, error) {
	bin, err := chserver.Command()
	if err != nil {
		return nil, fmt.Errorf("%w: install it with: %s", ErrNoClickHouse, InstallClickHouse)
	}
	return bin, nil
}

// StartClickHouse starts clickhouse-server listening on addr (native) and httpAddr, with
// its data, configuration and logs under dir, and waits until it answers queries.
func StartClickHouse(ctx context.Context, dir, addr, httpAddr string) (*ClickHouse, error) {
	bin, err := ClickHouseCommand()
	if err != nil {
		return nil, err
	}
	host, tcpPort, err := splitPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cannot read ClickHouse address %q: %w", addr, err)
	}
	_, httpPort, err := splitPort(httpAddr)
	if err != nil {
		return nil, fmt.Errorf("cannot read ClickHouse HTTP address %q: %w", httpAddr, err)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("cannot resolve %s: %w", dir, err)
	}
	config, err := chserver.WriteConfig(dir, host, tcpPort, httpPort)
	if err != nil {
		return nil, err
	}
	p, err := Start(Cmd{Name: "clickhouse", Path: bin[0], Args: append(bin[1:], "--config-file="+config),
		Dir: dir, Log: filepath.Join(dir, "log", "stdout.log")})
	if err != nil {
		return nil, err
	}
	ch := &ClickHouse{Addr: addr, HTTPAddr: httpAddr, Dir: dir, Log: chserver.ErrLog(dir), proc: p}
	if err := chserver.WaitReady(ctx, addr, p.Done(), 90*time.Second); err != nil {
		ch.Stop(10 * time.Second)
		return nil, fmt.Errorf("%w\n%s", err, lastLines(ch.Log, 10))
	}
	return ch, nil
}

// Stop stops the server, waiting up to grace before killing it.
func (c *ClickHouse) Stop(grace time.Duration) error { return c.proc.Stop(grace) }

// Done is closed when the server has exited.
func (c *ClickHouse) Done() <-chan struct{} { return c.proc.Done() }

// lastLines returns up to n last lines of a file, indented, or nothing when unreadable.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

func splitPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(port)
	return host, n, err
}
