package reqbody

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	// ErrTooLarge is a body over the per-request limit.
	ErrTooLarge = errors.New("request body over the limit")
	// ErrBudgetFull is a body that does not fit in the budget beside those held.
	ErrBudgetFull = errors.New("the request bodies held already take their memory limit")
	// ErrStalled is a body whose client sent nothing for the idle timeout.
	ErrStalled = errors.New("the request body stalled")
)

// IdleTimeout is how long a body ReadRequest reads may send nothing before it is given
// up: a client that stops sending, or a chunked body that never ends, would hold its
// connection and its memory of the budget for ever.
const IdleTimeout = time.Minute

// DefaultLimit is the budget of a handler given none.
const DefaultLimit = 512 << 20

// chunk is the buffer a body starts in; it doubles as the body arrives.
const chunk = 64 << 10

// Budget is the memory the request bodies held share.
type Budget struct {
	limit   int64
	held    atomic.Int64
	refused *prometheus.CounterVec
}

// NewBudget returns a budget of limit bytes. With reg, it registers
// emitter_request_body_bytes_held and emitter_request_bodies_refused_total{route}.
func NewBudget(limit int64, reg prometheus.Registerer) *Budget {
	b := &Budget{limit: limit, refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "emitter", Name: "request_bodies_refused_total",
		Help: "Request bodies the memory budget (EMITTER_MAX_PARSE_MEMORY) had no room for, by route: proxy (forwarded unread), ingest, feedback and otlp_http (503), otlp_grpc (Unavailable)."},
		[]string{"route"})}
	if reg != nil {
		reg.MustRegister(b.refused, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "emitter", Name: "request_body_bytes_held",
			Help: "Memory held for request bodies (proxy, ingest, OTLP), at most EMITTER_MAX_PARSE_MEMORY."},
			func() float64 { return float64(b.held.Load()) }))
	}
	return b
}

// Reserve takes n bytes; it reports false, taking nothing, when they do not fit.
func (b *Budget) Reserve(n int64) bool {
	if b.held.Add(n) > b.limit {
		b.held.Add(-n)
		return false
	}
	return true
}

// Release gives back n bytes taken with Reserve, or held by a body Read returned.
func (b *Budget) Release(n int64) { b.held.Add(-n) }

// Held returns the bytes taken.
func (b *Budget) Held() int64 { return b.held.Load() }

// Refusals returns the counter of the bodies of route the budget had no room for, its
// series present from now on.
func (b *Budget) Refusals(route string) prometheus.Counter { return b.refused.WithLabelValues(route) }

// Read reads a body of declared bytes (-1: unknown; net/http's ContentLength, which the
// server reads no further than) up to limit bytes, taking its memory from b as it grows:
// from one chunk up to the declared length, never to it at once, so a client declaring a
// large body and sending little holds little.
//
// held is what the returned bytes take of b; the caller releases it, whatever the error.
// Over limit the error is ErrTooLarge, and when b has no room for the next growth
// ErrBudgetFull; with these and with a read error, buf is what was read so far, which the
// rest of the body follows in r.
func Read(r io.Reader, declared, limit int64, b *Budget) (buf []byte, held int64, err error) {
	if declared > limit {
		return nil, 0, ErrTooLarge
	}
	want := declared
	if declared < 0 {
		want = limit + 1 // one byte more tells a body at the limit from one over it
	}
	held = min(want, chunk)
	if !b.Reserve(held) {
		return nil, 0, ErrBudgetFull
	}
	buf = make([]byte, 0, held)
	for int64(len(buf)) < want {
		if len(buf) == cap(buf) {
			grow := min(want, 2*held) - held
			if !b.Reserve(grow) {
				return buf, held, ErrBudgetFull
			}
			held += grow
			buf = append(make([]byte, 0, held), buf...)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if declared >= 0 && int64(len(buf)) < declared {
				return buf, held, io.ErrUnexpectedEOF
			}
			return buf, held, nil
		}
		if err != nil {
			return buf, held, err
		}
	}
	if declared < 0 {
		return buf, held, ErrTooLarge
	}
	return buf, held, nil
}

// ReadRequest reads req's body as Read does, giving it up with ErrStalled when nothing of it
// arrives for idle (IdleTimeout when not positive): before each read it moves the
// connection's read deadline idle ahead, and once the body is read whole it takes the
// deadline off. Where w cannot set a deadline (a test's recorder) it is Read.
func ReadRequest(w http.ResponseWriter, req *http.Request, limit int64, b *Budget, idle time.Duration) (buf []byte, held int64, err error) {
	if idle <= 0 {
		idle = IdleTimeout
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(idle)) != nil {
		return Read(req.Body, req.ContentLength, limit, b)
	}
	buf, held, err = Read(&idleReader{r: req.Body, rc: rc, idle: idle}, req.ContentLength, limit, b)
	if err == nil {
		// On an error the deadline stays: what net/http may still read of the body after
		// the answer is bounded too.
		_ = rc.SetReadDeadline(time.Time{})
	}
	return buf, held, err
}

// idleReader moves the read deadline before each read.
type idleReader struct {
	r    io.Reader
	rc   *http.ResponseController
	idle time.Duration
}

func (ir *idleReader) Read(p []byte) (int, error) {
	_ = ir.rc.SetReadDeadline(time.Now().Add(ir.idle))
	n, err := ir.r.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: nothing of it arrived for %s", ErrStalled, ir.idle)
	}
	return n, err
}
