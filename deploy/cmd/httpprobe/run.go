package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// maxBody is how much of the answer is echoed: enough for a /readyz report.
const maxBody = 4096

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("httpprobe", flag.ContinueOnError)
	fs.SetOutput(stdout)
	timeout := fs.Duration("timeout", 3*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: httpprobe [-timeout 3s] URL")
	}
	if *timeout <= 0 {
		return fmt.Errorf("-timeout=%s must be positive", *timeout)
	}
	target := fs.Arg(0)
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not a URL such as http://127.0.0.1:8080/readyz", target)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fmt.Errorf("cannot make a request for %s: %w", target, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach %s: %w", target, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s answered %s: %s", target, resp.Status, body)
	}
	_, err = stdout.Write(body)
	return err
}
