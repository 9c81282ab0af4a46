package proxy

import (
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync/atomic"
)

// loops are the relay loops of a proxy. Each upstream connection is adopted by one of them in
// turn, and the streams read from it are relayed and metered there: the streams of a busy
// proxy spread over as many threads as there are loops, as a web server's workers spread
// its connections.
type loops struct {
	ls   []*evloop
	next atomic.Uint32
}

// newLoops starts n loops, GOMAXPROCS when n is 0.
func newLoops(n int, logger *slog.Logger) (*loops, error) {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	ls := &loops{}
	for i := range n {
		l, err := newLoop(logger.With("loop", i))
		if err != nil {
			ls.close()
			return nil, fmt.Errorf("cannot start relay loop %d of %d: %w", i+1, n, err)
		}
		ls.ls = append(ls.ls, l)
	}
	return ls, nil
}

// adopt gives nc to the next loop.
func (ls *loops) adopt(nc net.Conn) (net.Conn, error) {
	l := ls.ls[int(ls.next.Add(1)-1)%len(ls.ls)]
	return l.adopt(nc)
}

func (ls *loops) close() {
	for _, l := range ls.ls {
		l.close()
	}
}
