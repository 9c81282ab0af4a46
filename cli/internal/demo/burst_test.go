package demo

import (
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
	for _, in := range []Incident{{At: -1, For: time.Second, Every: time.Minute}, {For: 0, Every: time.Minute}, {For: time.Minute, Every: time.Minute}} {
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
