package events

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// TestParseUTCMillisMatchesTimeParse: the fast path must agree with time.Parse wherever it
// answers, and must answer for what the project's writers produce.
func TestParseUTCMillisMatchesTimeParse(t *testing.T) {
	cases := []string{
		"2026-11-30T10:00:00.123Z", "2026-11-30T10:00:00Z", "2024-02-29T23:59:59.999Z", "2023-02-29T00:00:00Z",
		"2026-13-01T00:00:00Z", "2026-11-31T00:00:00Z", "2026-11-30T24:00:00Z", "2026-11-30T10:00:60Z",
		"2026-11-30T10:00:00.12Z", "2026-11-30 10:00:00Z", "2026-11-30T10:00:00.123+00:00", "abcd-11-30T10:00:00Z",
		"2026-00-10T00:00:00Z", "2026-11-00T00:00:00Z", "1900-02-29T00:00:00Z", "2000-02-29T00:00:00Z",
	}
	r := rand.New(rand.NewPCG(1, 1))
	for range 20000 {
		ts := time.Unix(r.Int64N(4e9), int64(r.IntN(1000))*1e6).UTC()
		cases = append(cases, ts.Format(TimeLayout), ts.Format(time.RFC3339))
	}
	for _, s := range cases {
		fast, ok := parseUTCMillis(s)
		slow, err := time.Parse(time.RFC3339Nano, s)
		if ok && (err != nil || !fast.Equal(slow)) {
			t.Fatalf("%q: fast %v, time.Parse %v %v", s, fast, slow, err)
		}
		if !ok && err == nil && len(s) == 24 && s[23] == 'Z' {
			t.Fatalf("%q: the fast path declined a timestamp in the writers' form", s)
		}
	}
}

func TestFastFloatMatchesParseFloat(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	cases := []string{"0", "-0", "0.0", "412.5", "6120.75", "1", "123456789012345", "1234567890123456", "0.000000000000001",
		"0.0000000000000001", "99999.999999999", "-3.25", "000123.4500"}
	for range 200000 {
		v := r.Float64() * math.Pow(10, float64(r.IntN(12)))
		cases = append(cases, strconv.FormatFloat(v, 'f', -1, 64), strconv.FormatFloat(v, 'f', r.IntN(8), 64))
	}
	for _, s := range cases {
		want, err := strconv.ParseFloat(s, 64)
		got, ok := fastFloat(s)
		if ok && (err != nil || got != want || math.Signbit(got) != math.Signbit(want)) {
			t.Fatalf("%q: fast %v, ParseFloat %v %v", s, got, want, err)
		}
	}
}

// TestAppendTime checks the fast path against time.Time.AppendFormat, across zones,
// precisions and the years it falls back on.
func TestAppendTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	zones := []*time.Location{time.UTC, time.FixedZone("x", -7*3600-30*60), time.FixedZone("y", 14*3600)}
	cases := []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 30, 12, 0, 0, 123_456_789, zones[1]),
	}
	for range 10_000 {
		cases = append(cases, time.Unix(rng.Int64N(1<<36)-(1<<35), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))]))
	}
	for _, c := range cases {
		want := c.UTC().AppendFormat(nil, TimeLayout)
		if got := AppendTime(nil, c); string(got) != string(want) {
			t.Fatalf("AppendTime(%v) = %s, want %s", c, got, want)
		}
	}
}
