package demo

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestIncidentActive(t *testing.T) {
	in := Incident{At: 40 * time.Second, For: 40 * time.Second, Every: 2 * time.Minute}
	f := func(elapsed time.Duration, wantOn bool, wantUntil time.Duration) {
		t.Helper()
		on, until := in.active(elapsed)
		if on != wantOn || until != wantUntil {
			t.Fatalf("active(%s) = %v, %s; want %v, %s", elapsed, on, until, wantOn, wantUntil)
		}
	}
	f(0, false, 40*time.Second)
	f(39*time.Second, false, 40*time.Second)
	f(40*time.Second, true, 80*time.Second)
	f(79*time.Second, true, 80*time.Second)
	f(80*time.Second, false, 160*time.Second)
	f(160*time.Second, true, 200*time.Second)
	f(205*time.Second, false, 280*time.Second)
}

func TestIncidentValidate(t *testing.T) {
	for _, in := range []Incident{{At: -1, For: time.Second, Every: time.Minute}, {For: 0, Every: time.Minute}, {For: time.Minute, Every: time.Minute},
		// a window under a second starts and stops the clients without pause
		{For: time.Nanosecond, Every: 2 * time.Nanosecond},
		// times past a year could wrap when added up: the burst would spin
		{At: time.Hour, For: time.Second, Every: 2562047 * time.Hour}, {At: 2562047 * time.Hour, For: time.Second, Every: time.Minute}} {
		if in.Validate() == nil {
			t.Errorf("%+v: want an error", in)
		}
	}
	if err := DefaultIncident.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestParseIncident(t *testing.T) {
	in, err := ParseIncident("at=10s, for=20s,every=1m")
	if err != nil || in != (Incident{At: 10 * time.Second, For: 20 * time.Second, Every: time.Minute}) {
		t.Fatalf("%+v, %v", in, err)
	}
	if in, err := ParseIncident("at=0s"); err != nil || in.For != DefaultIncident.For || in.At != 0 {
		t.Fatalf("%+v, %v", in, err)
	}
	for _, bad := range []string{"at=soon", "when=1s", "for=2m,every=1m", ""} {
		if _, err := ParseIncident(bad); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}

// TestEngineHoldsTheSteadyLoad checks the fake engine's sizing against the proxied load, by
// Little's law (requests running = arrival rate × time in the engine): the generated
// conversation workload at 1× (replay's conversation shape: 5.5 requests/s, ±25 % swell, ×3
// bursts, log-normal input and output tokens of median 1,020 and 129) must fit in the
// batch even in its own bursts, so that between incidents nothing queues and an incident's
// queue drains; its tokens must fit the KV cache twice over; and the incident's clients
// must overrun the batch.
func TestEngineHoldsTheSteadyLoad(t *testing.T) {
	const rate, swell, burstFactor = 5.5, 0.25, 3.0
	meanIn := math.Exp(6.93 + 0.99*0.99/2)  // mean of the log-normal, ≈ 1,670 tokens
	meanOut := math.Exp(4.86 + 0.86*0.86/2) // ≈ 187 tokens
	inEngine := engineTTFT.Seconds() + enginePrefillPer.Seconds()*meanIn/1000 + (meanOut-1)*engineTPOT.Seconds()
	steady := rate * (1 + swell) * inEngine // running at the swell's top
	inBurst := rate * burstFactor * inEngine
	if steady > engineBatch/2 || inBurst > engineBatch {
		t.Errorf("%.0f requests running at the swell's top, %.0f in the workload's bursts: a batch of %d queues them (want at most half of it, and all of it)",
			steady, inBurst, engineBatch)
	}
	if kv := float64(engineBatch) * (meanIn + meanOut); kv > engineKVTokens/2 {
		t.Errorf("a full batch holds %.0f KV tokens on average, over half of the %d", kv, engineKVTokens)
	}
	burstIn := burstWords + float64(len(strings.Fields(systemPrompt)))
	burstEngine := engineTTFT.Seconds() + enginePrefillPer.Seconds()*burstIn/1000 + (burstTokens-1)*engineTPOT.Seconds()
	if demand := float64(burstClients) + rate*inEngine; demand < 2*engineBatch {
		t.Errorf("the incident keeps %.0f requests in the engine (%d clients, %.1f s each), want at least twice the batch of %d", demand, burstClients, burstEngine, engineBatch)
	}
}
