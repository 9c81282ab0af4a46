package testbed

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/chdb"
)

// InstallHint is how to get the server the tests need on Debian.
const InstallHint = "apt-get install -y clickhouse-server"

var (
	chOnce sync.Once
	chSrv  *ClickHouseServer
	chErr  error
)

// ClickHouse returns the configuration of a fresh, empty database on the test binary's
// ClickHouse server, dropped when the test ends. The server is started once per test binary
// (see Main) unless CLICKHOUSE_ADDR names one.
func ClickHouse(t testing.TB) chdb.Config {
	t.Helper()
	chOnce.Do(func() {
		if addr := os.Getenv("CLICKHOUSE_ADDR"); addr != "" {
			chSrv = &ClickHouseServer{Addr: addr}
			return
		}
		chSrv, chErr = StartClickHouse(filepath.Join(os.TempDir(), "tokenscope-ch-"+randHex(4)))
	})
	if chErr != nil {
		if errors.Is(chErr, errNoBinary) && os.Getenv("CI") != "true" {
			t.Skipf("ClickHouse is not installed (%v); install it with: %s", chErr, InstallHint)
		}
		t.Fatalf("cannot start ClickHouse: %v", chErr)
	}
	cfg := chdb.Config{
		Addr:        chSrv.Addr,
		DB:          "t_" + randHex(6),
		User:        envOr("CLICKHOUSE_USER", "default"),
		Password:    os.Getenv("CLICKHOUSE_PASSWORD"),
		DialTimeout: 5 * time.Second,
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if db, err := chdb.Open(ctx, cfg); err == nil {
			_ = db.Conn().Exec(ctx, "DROP DATABASE IF EXISTS "+cfg.DB)
			db.Close()
		}
	})
	return cfg
}

// Main runs the tests of a package and stops the ClickHouse server they started, if any.
// Use it from TestMain: func TestMain(m *testing.M) { testbed.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	if chSrv != nil {
		chSrv.Stop()
	}
	os.Exit(code)
}

var errNoBinary = errors.New("clickhouse-server binary not found")

// ClickHouseServer is a private clickhouse-server process.
type ClickHouseServer struct {
	Addr     string // native protocol, host:port
	HTTPAddr string
	Dir      string
	cmd      *exec.Cmd
	done     chan error
	stopOnce sync.Once
}

func findBinary() ([]string, error) {
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
	return nil, errNoBinary
}

// StartClickHouse starts clickhouse-server with its data in dir on free ports and waits
// until it answers queries.
func StartClickHouse(dir string) (*ClickHouseServer, error) {
	bin, err := findBinary()
	if err != nil {
		return nil, err
	}
	tcpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := freePort()
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{"data", "tmp", "log", "user_files", "format_schemas"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("cannot create %s: %w", dir, err)
		}
	}
	config := fmt.Sprintf(configXML, dir, tcpPort, httpPort)
	if err := os.WriteFile(filepath.Join(dir, "config.xml"), []byte(config), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write ClickHouse config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users.xml"), []byte(usersXML), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write ClickHouse users: %w", err)
	}
	args := append(bin[1:], "--config-file="+filepath.Join(dir, "config.xml"))
	cmd := exec.Command(bin[0], args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start %s: %w", bin[0], err)
	}
	s := &ClickHouseServer{
		Addr:     "127.0.0.1:" + strconv.Itoa(tcpPort),
		HTTPAddr: "127.0.0.1:" + strconv.Itoa(httpPort),
		Dir:      dir,
		cmd:      cmd,
		done:     make(chan error, 1),
	}
	go func() { s.done <- cmd.Wait() }()
	if err := s.waitReady(60 * time.Second); err != nil {
		s.Stop()
		logTail, _ := os.ReadFile(filepath.Join(dir, "log", "err.log"))
		return nil, fmt.Errorf("%w; output: %s; error log: %s", err, tail(out.String()), tail(string(logTail)))
	}
	return s, nil
}

func (s *ClickHouseServer) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	cfg := chdb.Config{Addr: s.Addr, DB: "default", User: "default", DialTimeout: time.Second}
	for {
		select {
		case err := <-s.done:
			s.done <- err
			return fmt.Errorf("clickhouse-server exited at start: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		db, err := chdb.Open(ctx, cfg)
		cancel()
		if err == nil {
			db.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("clickhouse-server did not answer on %s in %s: %w", s.Addr, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause stops the server process (SIGSTOP) so that it neither answers nor closes
// connections, the way a hung server behaves; Resume continues it.
func (s *ClickHouseServer) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *ClickHouseServer) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *ClickHouseServer) signal(sig syscall.Signal) error {
	if s.cmd == nil {
		return errors.New("the ClickHouse server was not started by the testbed")
	}
	return syscall.Kill(-s.cmd.Process.Pid, sig)
}

// Stop stops the server and removes its folder; calling it again does nothing.
func (s *ClickHouseServer) Stop() {
	s.stopOnce.Do(func() {
		if s.cmd == nil {
			return
		}
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGCONT)
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
		_ = os.RemoveAll(s.Dir)
	})
}

// Server returns the test binary's ClickHouse server, starting it when needed, for tests
// that stop or pause it. It is nil (and the test skipped or failed) as ClickHouse would be.
func Server(t testing.TB) *ClickHouseServer {
	t.Helper()
	ClickHouse(t)
	return chSrv
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}

// The root element is <yandex> so that 18.16 reads it; current servers still accept it.
const configXML = `<?xml version="1.0"?>
<yandex>
  <logger>
    <level>warning</level>
    <log>%[1]s/log/server.log</log>
    <errorlog>%[1]s/log/err.log</errorlog>
    <size>10M</size>
    <count>1</count>
  </logger>
  <listen_host>127.0.0.1</listen_host>
  <tcp_port>%[2]d</tcp_port>
  <http_port>%[3]d</http_port>
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
