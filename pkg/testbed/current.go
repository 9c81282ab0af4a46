package testbed

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// CurrentInstallHint is how to install the current ClickHouse engine the compatibility
// tests run on: chDB's libchdb (ClickHouse 26.x) for Node.js, into a git-ignored folder.
const CurrentInstallHint = "make chdb (scripts/install-chdb.sh: npm install in pkg/testbed/testdata/chdb)"

// chdbDir is where the Node.js project that drives chDB lives, relative to the checkout.
const chdbDir = "pkg/testbed/testdata/chdb"

// Current is a current ClickHouse engine: chDB, ClickHouse embedded in libchdb, run in a
// Node.js process the test talks to over pipes. It listens on no port, so services cannot
// reach it; tests run DDL and queries on it directly, to compare with the 18.16 server.
// Statements run one at a time, in order, in one session whose current database is DB.
type Current struct {
	Version string // as SELECT version() answers, e.g. 26.7.2.1
	DB      string

	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	done chan struct{}
	errs *syncBuffer
}

// CurrentClickHouse starts a current ClickHouse engine for the test, with an empty database
// tokenscope selected, and stops it when the test ends. Without Node.js or the chdb package
// the test is skipped with the install hint, or fails under CI=true.
func CurrentClickHouse(t testing.TB) *Current {
	t.Helper()
	c, err := StartCurrent(t.TempDir())
	if err != nil {
		if errors.Is(err, errNoCurrent) && os.Getenv("CI") != "true" {
			t.Skipf("%v; install it with: %s", err, CurrentInstallHint)
		}
		t.Fatalf("cannot start the current ClickHouse engine: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("current ClickHouse: %v", err)
		}
	})
	return c
}

var errNoCurrent = errors.New("the current ClickHouse engine (chDB for Node.js) is not installed")

// findChdb returns the driver's folder, looking up from the working directory for the
// checkout, and checks node and the chdb package are there.
func findChdb() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", fmt.Errorf("%w: node not found", errNoCurrent)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		dir := filepath.Join(d, chdbDir)
		if _, err := os.Stat(filepath.Join(dir, "driver.js")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "node_modules", "chdb", "package.json")); err != nil {
				return "", fmt.Errorf("%w: no %s/node_modules/chdb", errNoCurrent, chdbDir)
			}
			return dir, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no %s above %s", chdbDir, wd)
		}
	}
}

// StartCurrent starts the engine with its data in dir.
func StartCurrent(dir string) (*Current, error) {
	drv, err := findChdb()
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "chdb")
	// The engine reads config.xml from its working directory, as clickhouse-local does:
	// run it in a folder of its own so that it never picks up a server's configuration.
	work := filepath.Join(dir, "work")
	for _, d := range []string{data, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	cmd := exec.Command("node", filepath.Join(drv, "driver.js"), data)
	cmd.Dir = work
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &Current{cmd: cmd, in: in, out: bufio.NewReaderSize(out, 1<<20), done: make(chan struct{}), errs: &syncBuffer{}, DB: "tokenscope"}
	cmd.Stderr = c.errs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start node: %w", err)
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	v, err := c.read(30 * time.Second)
	if err != nil {
		c.Close()
		return nil, err
	}
	c.Version = v
	for _, stmt := range []string{
		"CREATE DATABASE IF NOT EXISTS " + c.DB,
		"USE " + c.DB,
		// nan and inf as strings, so that JSON carries them.
		"SET output_format_json_quote_denormals = 1",
	} {
		if _, err := c.run(stmt, nil, ""); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

type driverRequest struct {
	SQL    string            `json:"sql"`
	Params map[string]string `json:"params,omitempty"`
	Format string            `json:"format,omitempty"`
}

type driverAnswer struct {
	OK    bool   `json:"ok"`
	Out   string `json:"out"`
	Error string `json:"error"`
}

func (c *Current) read(timeout time.Duration) (string, error) {
	type line struct {
		b   []byte
		err error
	}
	ch := make(chan line, 1)
	go func() {
		b, err := c.out.ReadBytes('\n')
		ch <- line{b, err}
	}()
	var l line
	select {
	case l = <-ch:
	case <-time.After(timeout):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		return "", fmt.Errorf("chDB did not answer within %s: %s", timeout, c.errs.String())
	}
	if l.err != nil {
		<-c.done
		return "", fmt.Errorf("chDB stopped: %v: %s", l.err, c.errs.String())
	}
	var a driverAnswer
	if err := json.Unmarshal(l.b, &a); err != nil {
		return "", fmt.Errorf("cannot read chDB's answer %q: %w", l.b, err)
	}
	if !a.OK {
		return "", serverError(a.Error)
	}
	return a.Out, nil
}

var codeRE = regexp.MustCompile(`Code: (\d+)\. (?:DB::Exception: )?(.*)`)

// serverError turns the engine's message into the *clickhouse.Exception clickhouse-go
// returns for a server's refusal, so that code written for the driver reads both alike.
func serverError(msg string) error {
	m := codeRE.FindStringSubmatch(msg)
	if m == nil {
		return errors.New(msg)
	}
	code, _ := strconv.Atoi(m[1])
	return &clickhouse.Exception{Code: int32(code), Name: "DB::Exception", Message: strings.TrimSpace(m[2])}
}

func (c *Current) run(sql string, params map[string]string, format string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	req, err := json.Marshal(driverRequest{SQL: sql, Params: params, Format: format})
	if err != nil {
		return "", err
	}
	if _, err := c.in.Write(append(req, '\n')); err != nil {
		return "", fmt.Errorf("cannot send to chDB: %w: %s", err, c.errs.String())
	}
	return c.read(2 * time.Minute)
}

// Exec runs a statement. A refusal by the engine is a *clickhouse.Exception.
func (c *Current) Exec(_ context.Context, sql string) error {
	_, err := c.run(sql, nil, "")
	return err
}

// Query runs a query, binding params server-side ({name:Type} placeholders) when params is
// not nil, and returns its result.
func (c *Current) Query(sql string, params map[string]string) (*Result, error) {
	out, err := c.run(sql, params, "JSONCompact")
	if err != nil {
		return nil, err
	}
	return parseJSONCompact(out)
}

// Close stops the engine; calling it again does nothing.
func (c *Current) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.in == nil {
		return nil
	}
	c.in.Close()
	c.in = nil
	select {
	case <-c.done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
		return errors.New("chDB did not stop within 20s of closing its input")
	}
	return nil
}

// Strings runs a query and returns its first column as text (chdb.Executor).
func (c *Current) Strings(_ context.Context, sql string) ([]string, error) {
	res, err := c.Query(sql, nil)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(res.Rows))
	for _, r := range res.Rows {
		if len(r) == 0 {
			return nil, errors.New("a query of no columns")
		}
		out = append(out, fmt.Sprint(r[0]))
	}
	return out, nil
}

// Insert inserts one row (chdb.Executor): insert is "INSERT INTO table (columns…)".
func (c *Current) Insert(ctx context.Context, insert string, row ...any) error {
	var b bytes.Buffer
	b.WriteString(insert + " " + tsvInsert)
	for i, v := range row {
		if i > 0 {
			b.WriteByte('\t')
		}
		writeTSV(&b, normalize(reflect.ValueOf(v)), false)
	}
	b.WriteByte('\n')
	return c.Exec(ctx, b.String())
}
