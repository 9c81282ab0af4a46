package ops

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxConns bounds the connections of a server that answers only probes and scrapes.
const DefaultMaxConns = 256

// ConnLimit bounds the client connections a service holds open at once, over every listener
// it wraps: each costs a descriptor and buffers, so without a bound a flood of connections
// grows memory until the process dies. Past the limit a new connection is accepted and
// refused at once rather than left in the kernel's backlog, where it would wait unanswered
// and fill the listen queue for every client. A connection frees its place when it is
// closed, once, by whoever closes it: net/http, or a handler that took it over.
type ConnLimit struct {
	max      int64
	n        atomic.Int64
	answers  chan struct{} // places for refusals being answered (HTTP)
	open     *prometheus.GaugeVec
	refusals *prometheus.CounterVec
}

// maxAnswers bounds the refused HTTP connections being answered at once; past it, during a
// flood, a refused connection is closed without its 503. Each holds a descriptor and a
// goroutine for at most answerTimeout.
const maxAnswers = 128

// answerTimeout bounds the writing of a refusal and the wait for the client to read it.
const answerTimeout = time.Second

// refusalHTTP is the answer to an HTTP connection over the limit.
const refusalHTTP = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n" +
	"Retry-After: 1\r\nConnection: close\r\nContent-Length: 21\r\n\r\ntoo many connections\n"

// NewConnLimit returns a limit of max connections open at once (max > 0), counted in
// <namespace>_connections_open{listener} and <namespace>_connections_refused_total{listener}.
func NewConnLimit(max int, namespace string, reg prometheus.Registerer) *ConnLimit {
	l := &ConnLimit{max: int64(max), answers: make(chan struct{}, maxAnswers),
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "connections_open",
			Help: "Client connections open, by listener."}, []string{"listener"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "connections_refused_total",
			Help: "Client connections refused at once, the limit of open connections reached, by listener."}, []string{"listener"}),
	}
	reg.MustRegister(l.open, l.refusals)
	return l
}

// apart returns a limit of max connections of its own, counted in l's metrics.
func (l *ConnLimit) apart(max int) *ConnLimit {
	return &ConnLimit{max: int64(max), answers: make(chan struct{}, maxAnswers), open: l.open, refusals: l.refusals}
}

// Open returns how many connections are open.
func (l *ConnLimit) Open() int { return int(l.n.Load()) }

// HTTPListener returns ln with its connections counted under the listener label name; one
// refused gets a 503 with Retry-After, written apart from Accept, so that a client that
// reads nothing cannot hold it up.
func (l *ConnLimit) HTTPListener(ln net.Listener, name string) net.Listener {
	return l.listener(ln, name, true)
}

// Listener is HTTPListener for a protocol that gets no answer (gRPC): a refused connection
// is closed, and the client retries with its backoff.
func (l *ConnLimit) Listener(ln net.Listener, name string) net.Listener {
	return l.listener(ln, name, false)
}

func (l *ConnLimit) listener(ln net.Listener, name string, answer bool) net.Listener {
	return &limitListener{Listener: ln, l: l, answer: answer,
		open: l.open.WithLabelValues(name), refused: l.refusals.WithLabelValues(name)}
}

// take reserves a place, unless every place is taken.
func (l *ConnLimit) take() bool {
	for {
		n := l.n.Load()
		if n >= l.max {
			return false
		}
		if l.n.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

type limitListener struct {
	net.Listener
	l       *ConnLimit
	answer  bool
	open    prometheus.Gauge
	refused prometheus.Counter
}

func (ln *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ln.l.take() {
			ln.open.Inc()
			return &limitConn{Conn: c, ln: ln}, nil
		}
		ln.refused.Inc()
		ln.refuse(c)
	}
}

func (ln *limitListener) refuse(c net.Conn) {
	if ln.answer {
		select {
		case ln.l.answers <- struct{}{}:
			go func() {
				answerRefused(c)
				<-ln.l.answers
			}()
			return
		default:
		}
	}
	_ = c.Close()
}

// answerRefused writes the 503 and closes c, within answerTimeout. It half-closes first and
// waits for the client to hang up: closed with the client's request unread, the connection
// would be reset, and the client could lose the answer before reading it.
func answerRefused(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(answerTimeout))
	if _, err := io.WriteString(c, refusalHTTP); err == nil {
		if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
		}
	}
	_ = c.Close()
}

// limitConn holds a place until it is closed. Its reads and writes are the connection's own:
// the limit costs nothing per request.
type limitConn struct {
	net.Conn
	ln   *limitListener
	once sync.Once
}

// Close frees the place once, however often and by whomever it is called.
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.ln.open.Dec()
		c.ln.l.n.Add(-1)
	})
	return err
}

// CloseWrite lets net/http close the connection gracefully, as it does a TCP one; the place
// is held until Close.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// SyscallConn gives the socket to a handler that writes to it or watches it itself (the
// emitter's proxy); closing it still goes through Close.
func (c *limitConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("not a socket")
	}
	return sc.SyscallConn()
}
