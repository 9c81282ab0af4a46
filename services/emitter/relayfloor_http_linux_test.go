//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/emit"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

// serveRelayFloorHTTP is the relay floor (BENCH_PROXY=floor-http) doing, on its one loop, the
// least a measuring proxy must do per request beyond the bytes: parse the request's head and
// its JSON body, parse the answer's head, decode the chunks into the meter, and publish the
// event to NATS, as the emitter does. No goroutine per request, no net/http server: what a
// proxy built like nginx, all on one event loop, could reach on this machine.
func serveRelayFloorHTTP() error {
	emitter, stop, err := publishing(context.Background(), env.ToMap(os.Environ()), true, os.Stderr)
	if err != nil {
		return err
	}
	defer stop()
	instance := trimScheme(os.Getenv("EMITTER_UPSTREAM_URL"))
	failed := false
	return relayFloor(func(client, up int) floorPair {
		return &measuringPair{emitter: emitter, instance: instance, failed: &failed}
	})
}

// measuringPair relays a request once it is whole and parsed, and an answer as it comes,
// metering its chunks and publishing its event at its end.
type measuringPair struct {
	emitter  *emit.Emitter
	instance string
	failed   *bool  // an event was not published: said once
	in, out  []byte // a request, an answer's head, not yet whole
	head     bool   // the answer's head is parsed
	chunks   chunkDecoder
	m        meter.Meter
	ev       events.RequestEvent
}

func (p *measuringPair) fromClient(_, up int, b []byte) bool {
	p.in = append(p.in, b...)
	end := bytes.Index(p.in, []byte("\r\n\r\n"))
	if end < 0 {
		return true
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(p.in[:end+4])))
	if err != nil || int64(len(p.in)-end-4) < req.ContentLength {
		return true // more to come
	}
	var info struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
	}
	_ = json.Unmarshal(p.in[end+4:], &info)
	now := time.Now()
	p.m.Reset(meter.OpenAIChat, info.Stream, now)
	p.ev = events.RequestEvent{V: events.Version, EventID: events.NewEventID(), TS: now.UTC(), Model: info.Model,
		Provider: "openai", Instance: p.instance, Stream: info.Stream, Scene: "default", Env: "dev"}
	ok := writeAll(up, p.in)
	p.in, p.head = p.in[:0], false
	return ok
}

func (p *measuringPair) fromUpstream(client, _ int, b []byte) bool {
	if !writeAll(client, b) {
		return false
	}
	now := time.Now()
	if !p.head {
		p.out = append(p.out, b...)
		end := bytes.Index(p.out, []byte("\r\n\r\n"))
		if end < 0 {
			return true
		}
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(p.out[:end+4])), nil)
		if err != nil {
			return false
		}
		p.ev.HTTPStatus, p.head, p.chunks = resp.StatusCode, true, chunkDecoder{}
		b = append([]byte(nil), p.out[end+4:]...)
		p.out = p.out[:0]
	}
	if p.chunks.feed(b, func(data []byte) { p.m.Feed(data, now, nil) }) {
		res := p.m.Result(now)
		res.Fill(&p.ev)
		p.ev.Status, p.ev.ErrorCode = res.Status(p.ev.Stream)
		if err := p.emitter.Emit(&p.ev, now); err != nil && !*p.failed {
			*p.failed = true // the floor would cost less than it should
			fmt.Fprintln(os.Stderr, "floor-http: event not published:", err)
		}
	}
	return true
}

// chunkDecoder takes the chunked coding off a body, piece by piece.
type chunkDecoder struct {
	line []byte
	left int  // data bytes left in the chunk; -1 while a size line is read, -2 at the CRLF after data
	last bool // the size line said 0
}

// feed gives the data in p to data; it reports the body's end.
func (d *chunkDecoder) feed(p []byte, data func([]byte)) bool {
	if d.left == 0 && d.line == nil && !d.last {
		d.left = -1
	}
	for len(p) > 0 {
		switch {
		case d.left > 0:
			k := min(d.left, len(p))
			data(p[:k])
			d.left -= k
			p = p[k:]
			if d.left == 0 {
				d.left = -2
			}
		case d.left == -2:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				return false
			}
			p, d.left = p[i+1:], -1
		default:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				d.line = append(d.line, p...)
				return false
			}
			d.line = append(d.line, p[:i]...)
			p = p[i+1:]
			if d.last {
				return true // the empty line after the last chunk
			}
			size, _ := strconv.ParseUint(string(bytes.TrimSpace(d.line)), 16, 32)
			d.line = d.line[:0]
			if size == 0 {
				d.last = true
				continue
			}
			d.left = int(size)
		}
	}
	return false
}
