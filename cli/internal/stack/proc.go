package stack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Cmd is a child process to start.
type Cmd struct {
	Name string   // what the messages call it
	Path string   // the binary
	Args []string // its arguments, without the binary
	Env  []string // KEY=value added to this process's environment
	Dir  string   // working folder; empty: this process's
	Log  string   // file that receives its stdout and stderr (truncated at start)
}

// Proc is a started child process.
type Proc struct {
	Cmd
	cmd      *exec.Cmd
	logFile  *os.File
	done     chan struct{}
	err      error
	stopOnce sync.Once
	stopErr  error
}

// Start starts c with its output in c.Log, in a process group of its own that the kernel
// kills if this process dies first.
func Start(c Cmd) (*Proc, error) {
	f, err := os.Create(c.Log)
	if err != nil {
		return nil, fmt.Errorf("cannot create the log of %s: %w", c.Name, err)
	}
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot start %s (%s): %w", c.Name, c.Path, err)
	}
	p := &Proc{Cmd: c, cmd: cmd, logFile: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is how the process ended; valid once Done is closed.
func (p *Proc) Err() error {
	select {
	case <-p.done:
		if p.err == nil {
			return errors.New("exited")
		}
		return p.err
	default:
		return nil
	}
}

// Failure describes an exit that was not asked for: how it ended and its log's last lines.
func (p *Proc) Failure() error {
	return fmt.Errorf("%s stopped (%v); the end of %s:\n%s", p.Name, p.Err(), p.Log, lastLines(p.Log, 8))
}

// WaitReady polls url until it answers 200, the process exits, ctx ends or timeout passes.
func (p *Proc) WaitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return p.Failure()
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s was not ready at %s within %s; see %s:\n%s", p.Name, url, timeout, p.Log, lastLines(p.Log, 8))
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then kills it. Calling it
// again returns the first result.
func (p *Proc) Stop(grace time.Duration) error {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
			return
		default:
		}
		pgid := -p.cmd.Process.Pid
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(pgid, syscall.SIGKILL)
			<-p.done
			p.stopErr = fmt.Errorf("%s did not stop within %s and was killed", p.Name, grace)
		}
	})
	return p.stopErr
}
