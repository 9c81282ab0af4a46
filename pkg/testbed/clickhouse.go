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
	"github.com/tokenscope/tokenscope/pkg/chserver"
)

// InstallHint is how to get the server the tests need on Debian.
const InstallHint = chserver.InstallHint

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
			chSrv = &ClickHouseServer{Addr: addr, HTTPAddr: os.Getenv("CLICKHOUSE_HTTP_ADDR")}
			return
		}
		chSrv, chErr = StartClickHouse(filepath.Join(os.TempDir(), "tokenscope-ch-"+randHex(4)))
	})
	if chErr != nil {
		if errors.Is(chErr, chserver.ErrNotInstalled) && os.Getenv("CI") != "true" {
			t.Skipf("ClickHouse is not installed (%v); install it with: %s", chErr, InstallHint)
		}
		t.Fatalf("cannot start ClickHouse: %v", chErr)
	}
	cfg := chdb.Config{
		Addr:        chSrv.Addr,
		HTTPAddr:    chSrv.HTTPAddr,
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

// ClickHouseServer is a private clickhouse-server process.
type ClickHouseServer struct {
	Addr     string // native protocol, host:port
	HTTPAddr string
	Dir      string
	bin      []string // the command line that runs the server
	config   string   // its --config-file
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process has exited
	stopOnce sync.Once
}

// StartClickHouse starts clickhouse-server with its data in dir on free ports and waits
// until it answers queries. Another process may take a port between its choice and the
// server's bind (test binaries run side by side); the server is then started again on other
// ports, up to portAttempts times.
func StartClickHouse(dir string) (*ClickHouseServer, error) {
	bin, err := chserver.Command()
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		s, err := startOnFreePorts(dir, bin)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return s, err
		}
	}
}

// portAttempts is how many times StartClickHouse chooses ports before it gives up.
const portAttempts = 5

// errPortTaken marks a server that stopped because one of its ports was in use.
var errPortTaken = errors.New("a port of the ClickHouse server is in use")

// choosePort is freePort; tests replace it to hand the server a port that is taken.
var choosePort = freePort

func startOnFreePorts(dir string, bin []string) (*ClickHouseServer, error) {
	tcpPort, err := choosePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := choosePort()
	if err != nil {
		return nil, err
	}
	config, err := chserver.WriteConfig(dir, "127.0.0.1", tcpPort, httpPort)
	if err != nil {
		return nil, err
	}
	s := &ClickHouseServer{
		Addr:     "127.0.0.1:" + strconv.Itoa(tcpPort),
		HTTPAddr: "127.0.0.1:" + strconv.Itoa(httpPort),
		Dir:      dir,
		bin:      bin,
		config:   config,
	}
	if err := s.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// start runs the server process and waits until it answers queries.
func (s *ClickHouseServer) start() error {
	args := append(s.bin[1:len(s.bin):len(s.bin)], "--config-file="+s.config)
	cmd := exec.Command(s.bin[0], args...)
	cmd.Dir = s.Dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start %s: %w", s.bin[0], err)
	}
	exited := make(chan struct{})
	s.cmd, s.exited = cmd, exited
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := chserver.WaitReady(context.Background(), s.Addr, exited, 60*time.Second); err != nil {
		s.halt()
		logTail, _ := os.ReadFile(chserver.ErrLog(s.Dir))
		err = fmt.Errorf("%w; output: %s; error log: %s", err, tail(out.String()), tail(string(logTail)))
		if bytes.Contains(logTail, []byte("Address already in use")) {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return err
	}
	return nil
}

// Halt stops the server process, keeping its folder and ports, the way a node goes down:
// clients are refused until Restart.
func (s *ClickHouseServer) Halt() error {
	if s.cmd == nil {
		return errors.New("the ClickHouse server was not started by the testbed")
	}
	s.halt()
	return nil
}

// Restart starts a halted server again on its folder and ports and waits until it answers.
func (s *ClickHouseServer) Restart() error {
	if s.cmd == nil {
		return errors.New("the ClickHouse server was not started by the testbed")
	}
	select {
	case <-s.exited:
	default:
		return errors.New("the ClickHouse server is running")
	}
	// The ports were free while the server was down for anyone to take; a client socket
	// cannot (see freePort), another listener may for a while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.start()
		if err == nil || !errors.Is(err, errPortTaken) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// AddConfig writes a configuration file that the server merges into its own: name is
// relative to the server's folder, "config.d/<file>.xml" for the server's configuration or
// "users.d/<file>.xml" for users and profiles, an XML document whose root element is
// <yandex>. A running server reloads it within seconds for the sections ClickHouse reloads
// (remote_servers, profiles among them).
func (s *ClickHouseServer) AddConfig(name, xml string) error {
	path := filepath.Join(s.Dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("cannot create the folder of %s: %w", name, err)
	}
	if err := os.WriteFile(path, []byte(xml), 0o644); err != nil {
		return fmt.Errorf("cannot write the ClickHouse configuration %s: %w", name, err)
	}
	return nil
}

// halt stops the process (SIGTERM, then SIGKILL after 15 s) and waits until it has exited.
func (s *ClickHouseServer) halt() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

// CPU returns the CPU time, user and system, the server process has used (see ProcessCPU);
// false for a server the tests did not start.
func (s *ClickHouseServer) CPU() (time.Duration, bool) {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return 0, false
	}
	return ProcessCPU(s.cmd.Process.Pid)
}

// ProcessCPU returns the CPU time, user and system, process pid has used, read from
// /proc/<pid>/stat; false where /proc cannot tell (not Linux, no such process).
func ProcessCPU(pid int) (time.Duration, bool) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(st, ')')
	if i < 0 || i+2 > len(st) {
		return 0, false
	}
	f := strings.Fields(string(st[i+2:])) // fields after the command name: utime, stime are 12th and 13th
	if len(f) < 13 {
		return 0, false
	}
	user, err1 := strconv.ParseInt(f[11], 10, 64)
	sys, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(user+sys) * 10 * time.Millisecond, true // USER_HZ is 100 on Linux
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
		s.halt()
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

// freePort returns a port that nothing listens on now. It is chosen below the kernel's
// range for outgoing connections, which is where ":0" listeners and client sockets take
// theirs, so that no connection another test opens lands on it before the server binds it.
func freePort() (int, error) {
	low := ephemeralLow()
	for i := 0; i < 100 && low > firstPort+1000; i++ {
		var b [2]byte
		_, _ = rand.Read(b[:])
		port := firstPort + int(uint16(b[0])<<8|uint16(b[1]))%(low-firstPort)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		_ = l.Close()
		return port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("cannot find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// firstPort is the lowest port freePort chooses, above the ports services are known on.
const firstPort = 20000

// ephemeralLow returns the first port of the kernel's range for outgoing connections, 0
// where it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
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
