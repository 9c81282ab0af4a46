package report

import (
	"fmt"
	"strings"
	"time"
)

var layouts = []string{
	time.RFC3339Nano,
	"2006-01-02T15:04:05",
	"2006-01-02 15:04:05",
	"2006-01-02T15:04",
	"2006-01-02 15:04",
	"2006-01-02",
}

// ParseTime reads a point in time: "now", "now-2h" or "-2h" (relative to now), RFC 3339
// ("2026-11-30T10:00:00Z"), or a date and time without a zone ("2026-11-30 10:00",
// "2026-11-30"), read in loc.
func ParseTime(s string, now time.Time, loc *time.Location) (time.Time, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return time.Time{}, fmt.Errorf("empty time")
	case s == "now":
		return now, nil
	case strings.HasPrefix(s, "now-"), strings.HasPrefix(s, "-"):
		d, err := time.ParseDuration(strings.TrimPrefix(strings.TrimPrefix(s, "now"), "-"))
		if err != nil || d < 0 {
			return time.Time{}, fmt.Errorf("%q is not a time such as now-2h", s)
		}
		return now.Add(-d), nil
	}
	for _, l := range layouts {
		if t, err := time.ParseInLocation(l, s, loc); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time such as 2026-11-30T10:00:00Z, \"2026-11-30 10:00\", 2026-11-30 or now-2h", s)
}
