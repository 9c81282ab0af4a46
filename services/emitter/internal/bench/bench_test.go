package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
	"github.com/tokenscope/tokenscope/services/emitter/internal/fakellm"
	"github.com/tokenscope/tokenscope/services/emitter/internal/llmclient"
	"github.com/tokenscope/tokenscope/services/emitter/internal/meter"
)

func TestPercentiles(t *testing.T) {
	f := func(in []float64, want Percentiles) {
		t.Helper()
		if got := percentiles(in); got != want {
			t.Fatalf("percentiles(%v) = %+v, want %+v", in, got, want)
		}
	}
	f(nil, Percentiles{})
	f([]float64{7}, Percentiles{7, 7, 7, 1})
	// numpy.percentile([1..101], [50, 95, 99]) = 51, 96, 100
	v := make([]float64, 101)
	for i := range v {
		v[100-i] = float64(i + 1)
	}
	f(v, Percentiles{51, 96, 100, 101})
	f([]float64{10, 20}, Percentiles{15, 19.5, 19.9, 2})
}

type counter struct{ n, invalid atomic.Int64 }

func (c *counter) Emit(ev *events.RequestEvent, now time.Time) error {
	if err := ev.ValidateAt(now); err != nil {
		c.invalid.Add(1)
		return err
	}
	c.n.Add(1)
	return nil
}

func TestRunBothProtocols(t *testing.T) {
	fake := httptest.NewServer(fakellm.New(fakellm.Options{TTFT: 4 * time.Millisecond, PrefillPer1K: 20 * time.Millisecond, TPOT: 500 * time.Microsecond}))
	defer fake.Close()
	for _, proto := range []meter.Protocol{meter.OpenAIChat, meter.Anthropic} {
		var em counter
		var bar bytes.Buffer
		res, err := Run(context.Background(), Options{Client: &llmclient.Client{BaseURL: fake.URL + "/v1", Protocol: proto, HTTP: fake.Client()},
			Endpoint: fake.URL, Model: "m", Classes: []Class{{"short", 100}, {"long", 3000}}, Requests: 8, Concurrency: 2, MaxTokens: 10,
			Stream: true, Scene: "bench", Env: "test", Progress: &bar}, &em)
		if err != nil {
			t.Fatal(err)
		}
		if em.n.Load() != 16 || em.invalid.Load() != 0 {
			t.Fatalf("%d events emitted, %d invalid", em.n.Load(), em.invalid.Load())
		}
		short, long := res.Classes[0], res.Classes[1]
		if short.OK != 8 || short.InputTokens != 100 || short.Bucket != "0-499" || long.Bucket != "2000-7999" {
			t.Fatalf("summaries %+v", res.Classes)
		}
		// The fake's prefill grows with the prompt: long prompts must show a longer TTFT.
		if long.TTFT.P50 <= short.TTFT.P50 || short.TPOT.N != 8 || short.Total.P99 < short.TTFT.P99 {
			t.Fatalf("short %+v long %+v", short, long)
		}
		if !strings.Contains(bar.String(), "16/16") {
			t.Fatalf("progress %q", bar.String())
		}
		var table bytes.Buffer
		if err := res.WriteTable(&table); err != nil || !strings.Contains(table.String(), "2000-7999") {
			t.Fatalf("table %v:\n%s", err, table.String())
		}
	}
}

func TestComparison(t *testing.T) {
	prev := &Result{Classes: []Summary{{Class: "short", TTFT: Percentiles{100, 200, 400, 20}, TPOT: Percentiles{10, 10, 10, 20}, Total: Percentiles{1, 1, 1, 20}}}}
	cur := &Result{Classes: []Summary{{Class: "short", TTFT: Percentiles{50, 200, 500, 20}, TPOT: Percentiles{10, 10, 10, 20}, Total: Percentiles{1, 1, 1, 20}},
		{Class: "long", TTFT: Percentiles{1, 1, 1, 1}}}}
	data, _ := json.Marshal(prev)
	var back Result
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteComparison(&out, &back, cur); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"-50.0%", "+0.0%", "+25.0%", "long", "not in the previous run"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("comparison lacks %q:\n%s", want, out.String())
		}
	}
}

func TestParseClasses(t *testing.T) {
	c, err := ParseClasses("short=128, long=8192")
	if err != nil || len(c) != 2 || c[1] != (Class{"long", 8192}) {
		t.Fatalf("%v %v", c, err)
	}
	for _, bad := range []string{"short", "short=0", "=5", "short=x"} {
		if _, err := ParseClasses(bad); err == nil {
			t.Errorf("ParseClasses(%q) accepted", bad)
		}
	}
}
