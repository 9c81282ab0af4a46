package report

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"
)

// Text returns a label (a model, scene or host name, as its producer sent it) fit for one
// table cell on a terminal: tabs, line breaks, other control characters, bidirectional
// overrides and bytes that are not UTF-8 are escaped as in Go source, so no label can forge
// a row, shift a column or send the terminal an escape sequence.
func Text(s string) string {
	clean := true
	for _, r := range s {
		if needsEscape(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case needsEscape(r) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case needsEscape(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

func needsEscape(r rune) bool {
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r)
}

// Heading says what a report covers, in one line.
func Heading(r Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s → %s", r.Range.From.Format(time.DateTime), r.Range.To.Format(time.DateTime))
	b.WriteString(" UTC")
	for _, f := range []struct{ k, v string }{{"model", r.Filter.Model}, {"scene", r.Filter.Scene}, {"env", r.Filter.Env}, {"layer", r.Filter.Layer}} {
		if f.v != "" {
			fmt.Fprintf(&b, ", %s=%s", f.k, Text(f.v))
		}
	}
	if s := r.Seconds(); s > 0 {
		fmt.Fprintf(&b, " (windows cover %s)", time.Duration(s)*time.Second)
	}
	return b.String()
}

// WriteTable writes the per-bucket table of r as aligned text.
func WriteTable(w io.Writer, r Report) error {
	if len(r.Rows) == 0 {
		_, err := fmt.Fprintf(w, "%s\nno requests in this range\n", Heading(r))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%s\n", Heading(r))
	fmt.Fprintln(tw, "model\tscene\tbucket\trequests\tTTFT p50\tp95\tp99\tTPOT p50\tp95\tp99\tout tok/s\terrors\ttimeouts\t")
	for _, x := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			Text(x.Model), Text(x.Scene), Text(x.Bucket), x.Requests,
			ms(x.TTFT.N, x.TTFT.P50), ms(x.TTFT.N, x.TTFT.P95), ms(x.TTFT.N, x.TTFT.P99),
			ms(x.TPOT.N, x.TPOT.P50), ms(x.TPOT.N, x.TPOT.P95), ms(x.TPOT.N, x.TPOT.P99),
			num(x.OutputTPS), pct(x.ErrorRate), pct(x.TimeoutRate))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write the table: %w", err)
	}
	_, err := fmt.Fprintln(w, "latencies in ms, merged from t-digest centroids; errors and timeouts as shares of requests (a timeout is never an error)")
	return err
}

// WriteComparison writes, per bucket, each percentile before → after and its change.
func WriteComparison(w io.Writer, c Comparison) error {
	fmt.Fprintf(w, "before: %s\nafter:  %s\n", Heading(c.Before), Heading(c.After))
	if len(c.Changes) == 0 {
		_, err := fmt.Fprintln(w, "no requests in either range")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tscene\tbucket\trequests\tTTFT p50\tTTFT p95\tTTFT p99\tTPOT p50\tTPOT p95\tTPOT p99\terrors\ttimeouts\t")
	for _, ch := range c.Changes {
		b, a := ch.Before, ch.After
		if b == nil {
			b = &Row{}
		}
		if a == nil {
			a = &Row{}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d → %d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", Text(ch.Model), Text(ch.Scene), Text(ch.Bucket), b.Requests, a.Requests,
			change(b.TTFT.N, b.TTFT.P50, a.TTFT.N, a.TTFT.P50), change(b.TTFT.N, b.TTFT.P95, a.TTFT.N, a.TTFT.P95), change(b.TTFT.N, b.TTFT.P99, a.TTFT.N, a.TTFT.P99),
			change(b.TPOT.N, b.TPOT.P50, a.TPOT.N, a.TPOT.P50), change(b.TPOT.N, b.TPOT.P95, a.TPOT.N, a.TPOT.P95), change(b.TPOT.N, b.TPOT.P99, a.TPOT.N, a.TPOT.P99),
			rates(b.Requests, b.ErrorRate, a.Requests, a.ErrorRate), rates(b.Requests, b.TimeoutRate, a.Requests, a.TimeoutRate))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write the comparison: %w", err)
	}
	_, err := fmt.Fprintln(w, "latencies in ms, before → after (change); errors and timeouts as shares of requests")
	return err
}

// ms formats a latency of n samples: "-" when there were none.
func ms(n uint64, v float64) string {
	if n == 0 {
		return "-"
	}
	return num(v)
}

func num(v float64) string {
	switch {
	case v < 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case v < 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

func pct(r float64) string { return strconv.FormatFloat(r*100, 'f', 2, 64) + "%" }

func change(nb uint64, b float64, na uint64, a float64) string {
	switch {
	case nb == 0 && na == 0:
		return "-"
	case nb == 0:
		return "- → " + num(a)
	case na == 0:
		return num(b) + " → -"
	}
	p, ok := PctChange(b, a)
	if !ok {
		return num(b) + " → " + num(a)
	}
	return fmt.Sprintf("%s → %s (%+.0f%%)", num(b), num(a), p)
}

func rates(nb uint64, b float64, na uint64, a float64) string {
	switch {
	case nb == 0 && na == 0:
		return "-"
	case nb == 0:
		return "- → " + pct(a)
	case na == 0:
		return pct(b) + " → -"
	}
	return pct(b) + " → " + pct(a)
}
