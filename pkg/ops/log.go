package ops

import (
	"io"
	"log/slog"
	"strings"
)

// NewLogger returns a service's JSON logger on w at level, every line carrying the service's
// name. Durations are written as Go writes them ("15s", "1m30s"), not as nanoseconds.
func NewLogger(w io.Writer, level slog.Leveler, service string) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: durationString})).With("service", service)
}

func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// Totals returns, as key and value pairs for a log line, the sum over every label set of
// each named counter (or gauge) in the server's registry, keyed by its name less the
// namespace and the _total suffix: Totals("emitter_published_total") is
// ["published", 120]. A metric not registered is 0; fractions are dropped.
func (s *Server) Totals(names ...string) []any {
	sums := make(map[string]float64, len(names))
	if mfs, err := s.registry.Gather(); err == nil {
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch {
				case m.Counter != nil:
					sums[mf.GetName()] += m.Counter.GetValue()
				case m.Gauge != nil:
					sums[mf.GetName()] += m.Gauge.GetValue()
				}
			}
		}
	}
	kv := make([]any, 0, 2*len(names))
	for _, n := range names {
		key := strings.TrimSuffix(n, "_total")
		if i := strings.IndexByte(key, '_'); i >= 0 {
			key = key[i+1:]
		}
		kv = append(kv, key, int64(sums[n]))
	}
	return kv
}
