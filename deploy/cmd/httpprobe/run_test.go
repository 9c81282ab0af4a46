package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.Write([]byte(`{"ready":true}`))
		case "/slow":
			time.Sleep(500 * time.Millisecond)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"ready":false,"failed":{"nats":"not connected"}}`))
		}
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/readyz"
	ln.Close()

	tests := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{name: "ready", args: []string{srv.URL + "/readyz"}, wantOut: `{"ready":true}`},
		{name: "not ready", args: []string{srv.URL + "/other"}, wantErr: "503 Service Unavailable: {\"ready\":false"},
		{name: "nothing listens", args: []string{closed}, wantErr: "cannot reach"},
		{name: "timeout", args: []string{"-timeout", "50ms", srv.URL + "/slow"}, wantErr: "deadline exceeded"},
		{name: "no url", args: nil, wantErr: "usage"},
		{name: "two urls", args: []string{srv.URL, srv.URL}, wantErr: "usage"},
		{name: "not a url", args: []string{"localhost:8080"}, wantErr: "is not a URL"},
		{name: "bad timeout", args: []string{"-timeout", "0s", srv.URL}, wantErr: "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tt.args, &out)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.wantOut {
				t.Fatalf("out = %q, want %q", out.String(), tt.wantOut)
			}
		})
	}
}
