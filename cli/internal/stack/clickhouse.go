package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// InstallClickHouse is how to get clickhouse-server on Debian.
const InstallClickHouse = "sudo apt-get update && sudo apt-get install -y clickhouse-server"

// ErrNoClickHouse means no clickhouse-server binary was found.
var ErrNoClickHouse = errors.New("clickhouse-server is not installed")

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
	if p, err := exec.LookPath("clickhouse-server"); err == nil {
		return []string{p}, nil
	}
	for _, p := range []string{"/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"} {
		if _, err := os.Stat(p); err == nil {
			return []string{p}, nil
		}
	}
	if p, err := exec.LookPath("clickhouse"); err == nil {
		return []string{p, "server"}, nil
	}
	return nil, fmt.Errorf("%w: install it with: %s", ErrNoClickHouse, InstallClickHouse)
}

// StartClickHouse starts clickhouse-server listening on addr (native) and httpAddr, with
// its data, configuration and logs under dir, and waits until it answers queries.
func StartClickHouse(ctx context.Context, dir, addr, httpAddr string) (*ClickHouse, error) {
	bin, err := ClickHouseCommand()
	if err != nil {
		return nil, err
	}
	host, tcpPort, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cannot read ClickHouse address %q: %w", addr, err)
	}
	_, httpPort, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return nil, fmt.Errorf("cannot read ClickHouse HTTP address %q: %w", httpAddr, err)
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot resolve %s: %w", dir, err)
	}
	for _, sub := range []string{"data", "tmp", "log", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("cannot create the ClickHouse folder: %w", err)
		}
	}
	conf := fmt.Sprintf(configXML, dir, host, tcpPort, httpPort)
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write the ClickHouse configuration: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(usersXML), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write the ClickHouse users: %w", err)
	}
	p, err := Start(Cmd{Name: "clickhouse", Path: bin[0], Args: append(bin[1:], "--config-file="+filepath.Join(dir, "config.xml")),
		Dir: dir, Log: filepath.Join(dir, "log", "stdout.log")})
	if err != nil {
		return nil, err
	}
	ch := &ClickHouse{Addr: addr, HTTPAddr: httpAddr, Dir: dir, Log: filepath.Join(dir, "log", "err.log"), proc: p}
	if err := ch.wait(ctx, 90*time.Second); err != nil {
		ch.Stop(10 * time.Second)
		return nil, fmt.Errorf("%w\n%s", err, lastLines(ch.Log, 10))
	}
	return ch, nil
}

func (c *ClickHouse) wait(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cfg := chdb.Config{Addr: c.Addr, DB: "default", User: "default", DialTimeout: time.Second}
	for {
		select {
		case <-c.proc.Done():
			return fmt.Errorf("clickhouse-server stopped at start (%v); its log: %s", c.proc.Err(), c.Log)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		db, err := chdb.Open(pctx, cfg)
		cancel()
		if err == nil {
			db.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("clickhouse-server did not answer on %s within %s: %w", c.Addr, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
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

// The root element is <yandex> so that Debian's 18.16 reads it; current servers accept it.
const configXML = `<?xml version="1.0"?>
<yandex>
  <logger>
    <level>warning</level>
    <log>%[1]s/log/server.log</log>
    <errorlog>%[1]s/log/err.log</errorlog>
    <size>10M</size>
    <count>2</count>
  </logger>
  <listen_host>%[2]s</listen_host>
  <tcp_port>%[3]s</tcp_port>
  <http_port>%[4]s</http_port>
  <path>%[1]s/data/</path>
  <tmp_path>%[1]s/tmp/</tmp_path>
  <user_files_path>%[1]s/user_files/</user_files_path>
  <format_schema_path>%[1]s/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>268435456</mark_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
</yandex>
`

const usersXML = `<?xml version="1.0"?>
<yandex>
  <profiles><default><max_memory_usage>4000000000</max_memory_usage></default></profiles>
  <users>
    <default>
      <password></password>
      <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
      <profile>default</profile>
      <quota>default</quota>
    </default>
  </users>
  <quotas><default></default></quotas>
</yandex>
`
