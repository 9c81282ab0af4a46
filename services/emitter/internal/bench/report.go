package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable writes the run as a table: one row per class, P50/P95/P99 of each metric in ms.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "class\tbucket\tinput\tok/n\tTTFT p50\tp95\tp99\tTPOT p50\tp95\tp99\ttotal p50\tp95\tp99\t\n")
	for _, s := range r.Classes {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Class, s.Bucket, s.InputTokens, s.OK, s.Requests,
			num(s.TTFT.P50, s.TTFT.N), num(s.TTFT.P95, s.TTFT.N), num(s.TTFT.P99, s.TTFT.N),
			num(s.TPOT.P50, s.TPOT.N), num(s.TPOT.P95, s.TPOT.N), num(s.TPOT.P99, s.TPOT.N),
			num(s.Total.P50, s.Total.N), num(s.Total.P95, s.Total.N), num(s.Total.P99, s.Total.N))
	}
	fmt.Fprintln(tw, "(milliseconds)")
	return tw.Flush()
}

func num(v float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

// WriteComparison writes, per class present in both runs, each percentile now and its change
// from prev, so that a configuration change shows its effect per input bucket.
func WriteComparison(w io.Writer, prev, cur *Result) error {
	old := map[string]Summary{}
	for _, s := range prev.Classes {
		old[s.Class] = s
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "class\tmetric\tp50\tΔ\tp95\tΔ\tp99\tΔ\t\n")
	for _, s := range cur.Classes {
		o, ok := old[s.Class]
		if !ok {
			fmt.Fprintf(tw, "%s\t(not in the previous run)\t\t\t\t\t\t\t\n", s.Class)
			continue
		}
		for _, m := range []struct {
			name     string
			now, was Percentiles
		}{{"TTFT", s.TTFT, o.TTFT}, {"TPOT", s.TPOT, o.TPOT}, {"total", s.Total, o.Total}} {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Class, m.name,
				num(m.now.P50, m.now.N), delta(m.now.P50, m.was.P50, m.now.N, m.was.N),
				num(m.now.P95, m.now.N), delta(m.now.P95, m.was.P95, m.now.N, m.was.N),
				num(m.now.P99, m.now.N), delta(m.now.P99, m.was.P99, m.now.N, m.was.N))
		}
	}
	fmt.Fprintf(tw, "(milliseconds; Δ against the run of %s)\n", prev.Started.Format("2006-01-02 15:04:05Z"))
	return tw.Flush()
}

// delta is the change in percent, signed.
func delta(now, was float64, nNow, nWas int) string {
	if nNow == 0 || nWas == 0 || was == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", (now-was)/was*100)
}
