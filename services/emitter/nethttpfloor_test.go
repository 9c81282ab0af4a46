package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"
)

// serveNetHTTPFloor serves on HTTP_ADDR a proxy to EMITTER_UPSTREAM_URL built from net/http
// alone, nothing measured and nothing published: what net/http's server and client cost per
// request, the floor under the emitter's proxy (the peer benchmarks' revproxy and nethttp).
// revproxy is httputil.ReverseProxy flushing every write; nethttp a handler doing the least a
// streaming proxy can with http.Transport: forward the request and its headers, copy the
// answer's headers, and write and flush each read of its body. Both read the request body
// before it goes upstream, as the emitter, nginx and the Caddy peer do: net/http's server
// closes an unread request body once the answer's headers are written, and http.Transport,
// still checking the body's end, then drops the upstream connection mid-answer.
func serveNetHTTPFloor(mode string) error {
	up, err := url.Parse(os.Getenv("EMITTER_UPSTREAM_URL"))
	if err != nil {
		return fmt.Errorf("cannot parse EMITTER_UPSTREAM_URL: %w", err)
	}
	t := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	var h http.Handler
	switch mode {
	case "revproxy":
		rp := httputil.NewSingleHostReverseProxy(up)
		rp.Transport, rp.FlushInterval = t, -1
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if readBody(w, r) {
				rp.ServeHTTP(w, r)
			}
		})
	case "nethttp":
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !readBody(w, r) {
				return
			}
			out := r.Clone(r.Context())
			out.RequestURI, out.URL.Scheme, out.URL.Host, out.Host = "", up.Scheme, up.Host, up.Host
			out.Header.Del("Connection")
			resp, err := t.RoundTrip(out)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			rc := http.NewResponseController(w)
			buf := make([]byte, 2<<10)
			for {
				n, err := resp.Body.Read(buf)
				if n > 0 {
					if _, werr := w.Write(buf[:n]); werr != nil {
						return
					}
					_ = rc.Flush()
				}
				if err != nil {
					return
				}
			}
		})
	default:
		return fmt.Errorf("unknown net/http floor %q", mode)
	}
	srv := &http.Server{Addr: os.Getenv("HTTP_ADDR"), Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("cannot serve: %w", err)
	}
	return nil
}

// readBody replaces r's body with a copy in memory; false if it could not be read.
func readBody(w http.ResponseWriter, r *http.Request) bool {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "cannot read the request body", http.StatusBadRequest)
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return true
}
