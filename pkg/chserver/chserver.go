// Package chserver prepares a private clickhouse-server: it finds the binary Debian's
// package installs, writes a minimal configuration for a folder and ports, and waits until
// the server answers queries. The test bed and the demo both run ClickHouse this way.
package chserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// InstallHint is how to get the server on Debian.
const InstallHint = "apt-get install -y clickhouse-server"

// Cluster is the name of the cluster WriteConfig defines: the server alone, as one shard of
// one replica, so that tests can put Distributed tables in front of local ones.
const Cluster = "tokenscope_local"

// ErrNotInstalled means no clickhouse-server binary was found.
var ErrNotInstalled = errors.New("clickhouse-server is not installed")

// Command returns the command line that runs the server: clickhouse-server, or the single
// clickhouse binary's "server" mode.
func Command() ([]string, error) {
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
	return nil, fmt.Errorf("%w: install it with: %s", ErrNotInstalled, InstallHint)
}

// WriteConfig creates dir's folders and a configuration listening on host at tcpPort
// (native protocol) and httpPort, logging to dir/log, and returns the path of the
// configuration file to pass as --config-file.
func WriteConfig(dir, host string, tcpPort, httpPort int) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("cannot resolve %s: %w", dir, err)
	}
	for _, sub := range []string{"data", "tmp", "log", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return "", fmt.Errorf("cannot create the ClickHouse folder: %w", err)
		}
	}
	config := filepath.Join(dir, "config.xml")
	if err := os.WriteFile(config, fmt.Appendf(nil, configXML, dir, host, tcpPort, httpPort, Cluster), 0o644); err != nil {
		return "", fmt.Errorf("cannot write the ClickHouse configuration: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(usersXML), 0o644); err != nil {
		return "", fmt.Errorf("cannot write the ClickHouse users: %w", err)
	}
	return config, nil
}

// ErrLog returns where a server configured by WriteConfig logs its errors.
func ErrLog(dir string) string { return filepath.Join(dir, "log", "err.log") }

// WaitReady polls addr until the server answers a query, exited is closed (the server
// stopped), ctx ends or timeout passes.
func WaitReady(ctx context.Context, addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cfg := chdb.Config{Addr: addr, DB: "default", User: "default", DialTimeout: time.Second}
	for {
		select {
		case <-exited:
			return errors.New("clickhouse-server stopped at start")
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		db, err := chdb.Open(pctx, cfg)
		cancel()
		if err == nil {
			return db.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("clickhouse-server did not answer on %s within %s: %w", addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
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
  <tcp_port>%[3]d</tcp_port>
  <http_port>%[4]d</http_port>
  <path>%[1]s/data/</path>
  <tmp_path>%[1]s/tmp/</tmp_path>
  <user_files_path>%[1]s/user_files/</user_files_path>
  <format_schema_path>%[1]s/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>268435456</mark_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
  <remote_servers>
    <%[5]s>
      <shard><replica><host>%[2]s</host><port>%[3]d</port></replica></shard>
    </%[5]s>
  </remote_servers>
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
