package baseline

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func opts() Options {
	return Options{Step: 5 * time.Minute, Slot: 30 * time.Minute, Days: 7, Location: time.UTC, SplitWeekends: true}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"step not dividing a day", func(o *Options) { o.Step = 7 * time.Minute }, "ALERTER_BASELINE_STEP"},
		{"step too small", func(o *Options) { o.Step = 10 * time.Second }, "ALERTER_BASELINE_STEP"},
		{"negative slot", func(o *Options) { o.Slot = -time.Minute }, "ALERTER_SLOT"},
		{"no days", func(o *Options) { o.Days = 0 }, "ALERTER_BASELINE_DAYS"},
		{"no location", func(o *Options) { o.Location = nil }, "ALERTER_TIMEZONE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := opts()
			tc.mod(&o)
			if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to name %s", err, tc.want)
			}
		})
	}
	if err := opts().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// The baseline is the slot on previous days only: values of the evaluated day, and of
// other times of day, must not leak in.
func TestStatsSameSlotPreviousDays(t *testing.T) {
	s, err := New[string](opts(), 1)
	if err != nil {
		t.Fatal(err)
	}
	h := s.Series("x")
	wed := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC) // a Wednesday
	for d := 1; d <= 9; d++ {
		day := wed.AddDate(0, 0, -d)
		weekend := day.Weekday() == time.Saturday || day.Weekday() == time.Sunday
		for m := -60; m <= 60; m++ {
			v := 100.0 + float64((m%3+3)%3-1) // 99, 100, 101 within the slot
			if m < -30 || m > 34 {
				v = 1000 // outside the slot
			}
			if weekend {
				v = 5 // weekends are another regime
			}
			if d > 7 {
				v = 1e6 // older than the history
			}
			ts := day.Add(time.Duration(m) * time.Minute)
			s.Add(h, s.StepOf(ts), 0, v)
		}
	}
	s.Add(h, s.StepOf(wed), 0, 1e9) // today: not part of its own baseline
	st := s.Stats(h, s.Plan(wed), 0, true)
	// The five weekdays of the last seven days × 65 minutes (slot ± 30 min in 5 min steps).
	if st.N != 5*65 {
		t.Errorf("N = %d, want %d", st.N, 5*65)
	}
	if math.Abs(st.Mean-100) > 0.05 || st.Std < 0.7 || st.Std > 0.9 {
		t.Errorf("mean %v std %v, want 100 and ≈ 0.82", st.Mean, st.Std)
	}
	if st.Median < 99 || st.Median > 101 || st.MAD > 1.5 {
		t.Errorf("median %v MAD %v, want ≈ 100 and ≤ 1.5", st.Median, st.MAD)
	}
	// A Saturday compares with the two weekend days only.
	sat := time.Date(2026, 3, 7, 14, 0, 0, 0, time.UTC)
	if st := s.Stats(h, s.Plan(sat), 0, false); st.N == 0 || st.Mean != 5 {
		t.Errorf("weekend baseline mean %v (N %d), want 5", st.Mean, st.N)
	}
	// Without the split, all seven days count.
	o := opts()
	o.SplitWeekends = false
	s2, _ := New[string](o, 1)
	h2 := s2.Series("x")
	for d := 1; d <= 7; d++ {
		s2.Add(h2, s2.StepOf(wed.AddDate(0, 0, -d)), 0, float64(d))
	}
	if st := s2.Stats(h2, s2.Plan(wed), 0, false); st.N != 7 || st.Mean != 4 {
		t.Errorf("unsplit baseline N %d mean %v, want 7 and 4", st.N, st.Mean)
	}
}

func TestPlanCrossesMidnight(t *testing.T) {
	s, _ := New[string](opts(), 1)
	h := s.Series("x")
	tue := time.Date(2026, 3, 3, 0, 10, 0, 0, time.UTC)
	// 23:50 the day before yesterday is within 30 min of 00:10 yesterday.
	s.Add(h, s.StepOf(time.Date(2026, 3, 1, 23, 50, 0, 0, time.UTC)), 0, 7)
	if st := s.Stats(h, s.Plan(tue), 0, false); st.N != 1 || st.Mean != 7 {
		t.Errorf("N %d mean %v, want the 23:50 value of the previous evening", st.N, st.Mean)
	}
}

func TestTimezone(t *testing.T) {
	tokyo := time.FixedZone("JST", 9*3600)
	o := opts()
	o.Location = tokyo
	s, _ := New[string](o, 1)
	// 23:00 UTC on a Friday is 08:00 on Saturday in Tokyo: a weekend day there.
	fri := time.Date(2026, 3, 6, 23, 0, 0, 0, time.UTC)
	h := s.Series("x")
	s.Add(h, s.StepOf(fri.AddDate(0, 0, -1)), 0, 1) // Friday 08:00 JST: a weekday
	s.Add(h, s.StepOf(fri.AddDate(0, 0, -6)), 0, 2) // Sunday 08:00 JST: a weekend day
	if st := s.Stats(h, s.Plan(fri), 0, false); st.N != 1 || st.Mean != 2 {
		t.Errorf("N %d mean %v, want the Sunday value only", st.N, st.Mean)
	}
}

func TestMergeMatchesAdd(t *testing.T) {
	s, _ := New[string](opts(), 1)
	a, b := s.Series("a"), s.Series("b")
	at := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	vals := []float64{3, 5, 8, 13, 21}
	var sum, sq float64
	for _, v := range vals {
		s.Add(a, s.StepOf(at.AddDate(0, 0, -1)), 0, v)
		sum += v
	}
	mean := sum / float64(len(vals))
	for _, v := range vals {
		sq += (v - mean) * (v - mean)
	}
	s.Merge(b, s.StepOf(at.AddDate(0, 0, -1)), 0, 3, (3+5+8)/3.0, variance(3, 5, 8), []float64{3, 5, 8})
	s.Merge(b, s.StepOf(at.AddDate(0, 0, -1)), 0, 2, (13+21)/2.0, variance(13, 21), []float64{13, 21})
	p := s.Plan(at)
	sa, sb := s.Stats(a, p, 0, false), s.Stats(b, p, 0, false)
	if sa.N != 5 || sb.N != 5 || math.Abs(sa.Mean-sb.Mean) > 1e-4 || math.Abs(sa.Std-sb.Std) > 1e-3 || math.Abs(sa.Std-math.Sqrt(sq/5)) > 1e-3 {
		t.Errorf("add %+v, merge %+v, want equal, std %v", sa, sb, math.Sqrt(sq/5))
	}
}

func variance(v ...float64) float64 {
	var s, q float64
	for _, x := range v {
		s += x
	}
	m := s / float64(len(v))
	for _, x := range v {
		q += (x - m) * (x - m)
	}
	return q / float64(len(v))
}

func TestCacheInvalidatedByPastWrites(t *testing.T) {
	s, _ := New[string](opts(), 1)
	h := s.Series("x")
	now := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	s.Add(h, s.StepOf(now.AddDate(0, 0, -1)), 0, 10)
	p := s.Plan(now)
	if st := s.Stats(h, p, 0, false); st.Mean != 10 {
		t.Fatalf("mean %v", st.Mean)
	}
	s.Add(h, p.Step, 0, 1000) // the current window: not in its baseline, cache stays
	s.Add(h, s.StepOf(now.AddDate(0, 0, -7)), 0, 20)
	if st := s.Stats(h, p, 0, false); st.N != 2 || st.Mean != 15 {
		t.Errorf("after a past write: N %d mean %v, want 2 and 15", st.N, st.Mean)
	}
}

func TestSweepAndRing(t *testing.T) {
	s, _ := New[string](opts(), 1)
	h := s.Series("old")
	t0 := time.Date(2026, 3, 3, 12, 0, 0, 0, time.UTC)
	s.Add(h, s.StepOf(t0), 0, 1)
	// Nine days later the ring slot is reused: the old cell must not show up.
	later := t0.AddDate(0, 0, 9)
	s.Add(s.Series("new"), s.StepOf(later), 0, 1)
	if st := s.Stats(h, s.Plan(t0.AddDate(0, 0, 8)), 0, false); st.N != 0 {
		t.Errorf("a value 8 days old is in a 7-day baseline (N %d)", st.N)
	}
	if n := s.Sweep(later); n != 1 || s.Len() != 1 || s.Lookup("old") != nil {
		t.Errorf("swept %d, left %d, want the old series gone", n, s.Len())
	}
}

// TestMaxSeries: past MaxSeries a new series' history is not kept (a flood of made-up
// labels would otherwise hold one for the whole history span): it is refused, counted, and
// works for the window at hand; once old series are swept, new ones are kept again.
func TestMaxSeries(t *testing.T) {
	o := opts()
	o.MaxSeries = 2
	s, err := New[string](o, 1)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC)
	for _, k := range []string{"a", "b", "c", "d", "a"} {
		s.Add(s.Series(k), s.StepOf(at), 0, 1)
	}
	if s.Len() != 2 || s.Refused() != 2 || s.Lookup("c") != nil || s.Lookup("a") == nil {
		t.Fatalf("%d series kept, %d refused, c kept %v", s.Len(), s.Refused(), s.Lookup("c") != nil)
	}
	later := at.AddDate(0, 0, o.Days+2)
	if n := s.Sweep(later); n != 2 {
		t.Fatalf("swept %d", n)
	}
	s.Series("c")
	if s.Len() != 1 || s.Lookup("c") == nil {
		t.Fatalf("after the sweep, %d series kept, c kept %v", s.Len(), s.Lookup("c") != nil)
	}
	o.MaxSeries = -1
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "ALERTER_MAX_SERIES") {
		t.Errorf("err = %v, want it to name ALERTER_MAX_SERIES", err)
	}
}

// TestValuesBeyondACellNotLearned: a value, or a cell loaded from ClickHouse, past what a
// float32 cell holds or squares is left out, so the baseline stays that of the others
// instead of becoming infinite or NaN.
func TestValuesBeyondACellNotLearned(t *testing.T) {
	at := time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)
	prev := at.AddDate(0, 0, -1)
	for _, tc := range []struct {
		name  string
		write func(s *Store[string], h *History, step int64)
	}{
		{"add beyond float32", func(s *Store[string], h *History, step int64) { s.Add(h, step, 0, 1e39) }},
		{"add whose square is beyond float32", func(s *Store[string], h *History, step int64) { s.Add(h, step, 0, -1e25) }},
		{"add all", func(s *Store[string], h *History, step int64) { s.AddAll(h, step, []float64{1e300}, []bool{true}) }},
		{"merge of a huge mean", func(s *Store[string], h *History, step int64) { s.Merge(h, step, 0, 3, 1e30, 0, []float64{1e30}) }},
		{"merge of a huge variance", func(s *Store[string], h *History, step int64) { s.Merge(h, step, 0, 3, 100, 1e40, []float64{100}) }},
		{"merge of a huge sample", func(s *Store[string], h *History, step int64) { s.Merge(h, step, 0, 3, 100, 1, []float64{100, 1e39}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := New[string](opts(), 1)
			h := s.Series("x")
			for m := -30; m <= 30; m++ {
				s.Add(h, s.StepOf(prev.Add(time.Duration(m)*time.Minute)), 0, 100+float64(m%2))
			}
			tc.write(s, h, s.StepOf(prev))
			st := s.Stats(h, s.Plan(at), 0, true)
			if st.N != 61 || math.Abs(st.Mean-100) > 1 || st.Std > 1 || math.Abs(st.Median-100) > 1 || st.MAD > 2 {
				t.Errorf("baseline %+v, want the 61 values near 100", st)
			}
		})
	}
	s, _ := New[string](opts(), 1)
	h := s.Series("x")
	s.Add(h, s.StepOf(prev), 0, 1e11)
	if st := s.Stats(h, s.Plan(at), 0, false); st.N != 1 || math.Abs(st.Mean-1e11) > 1e5 {
		t.Errorf("a large value within bounds: %+v", st)
	}
}

// TestDaylightSaving: the baseline is the same time of day on the wall clock across a
// daylight-saving change: 09:00 in Paris on the Monday after clocks went forward compares
// with 09:00 on the days before, which were an hour later in UTC.
func TestDaylightSaving(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skipf("no time zone database: %v", err)
	}
	o := opts()
	o.Location = paris
	s, _ := New[string](o, 1)
	h := s.Series("x")
	for _, d := range []int{23, 24, 25, 26, 27} { // the weekdays before 2026-03-29, clocks forward
		s.Add(h, s.StepOf(time.Date(2026, 3, d, 9, 0, 0, 0, paris)), 0, 100) // 08:00 UTC
		s.Add(h, s.StepOf(time.Date(2026, 3, d, 8, 0, 0, 0, paris)), 0, 1)   // an hour earlier on the wall clock
	}
	mon := time.Date(2026, 3, 30, 9, 0, 0, 0, paris) // 07:00 UTC
	if st := s.Stats(h, s.Plan(mon), 0, false); st.N != 5 || st.Mean != 100 {
		t.Errorf("N %d mean %v, want the five 09:00 values", st.N, st.Mean)
	}
}

// The median selects rather than sorts; on random, tied and sorted inputs of every small
// length it is the median a sort gives.
func TestMedianSelectsAsSortWould(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 64; n++ {
		for trial := range 20 {
			v := make([]float64, n)
			for i := range v {
				switch trial % 4 {
				case 0:
					v[i] = rng.NormFloat64()
				case 1:
					v[i] = float64(rng.IntN(3)) // many ties
				case 2:
					v[i] = float64(i) // sorted
				default:
					v[i] = float64(n - i) // reversed
				}
			}
			sorted := slices.Clone(v)
			slices.Sort(sorted)
			want := sorted[n/2]
			if n%2 == 0 {
				want = (sorted[n/2-1] + sorted[n/2]) / 2
			}
			if got := median(v); got != want {
				t.Fatalf("n %d trial %d: median %v, want %v", n, trial, got, want)
			}
		}
	}
}

// BenchmarkStats is one series' baseline of six metrics at a new step, over a week of
// 15 s windows: mean and σ alone, and with the median and MAD (the default).
func BenchmarkStats(b *testing.B) {
	s, err := New[string](opts(), 6)
	if err != nil {
		b.Fatal(err)
	}
	h := s.Series("a")
	now := time.Date(2026, 3, 4, 14, 0, 0, 0, time.UTC)
	vals, ok := make([]float64, 6), []bool{true, true, true, true, true, true}
	for t := now.AddDate(0, 0, -7); t.Before(now.Add(time.Hour)); t = t.Add(15 * time.Second) {
		for m := range vals {
			vals[m] = 100 + float64(t.Unix()%97) + float64(m)
		}
		s.AddAll(h, s.StepOf(t), vals, ok)
	}
	plans := make([]Plan, 12)
	for i := range plans {
		plans[i] = s.Plan(now.Add(time.Duration(i) * 5 * time.Minute))
	}
	for _, robust := range []bool{false, true} {
		name := "mean_sigma"
		if robust {
			name = "median_mad"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				p := plans[i%len(plans)]
				h.cacheAt = -1
				for m := range 6 {
					s.Stats(h, p, m, robust)
				}
			}
		})
	}
}
