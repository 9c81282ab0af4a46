package events

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultBuckets are the input-token bounds used when AGG_BUCKETS is not set: long prompts
// must never pollute short prompts' percentiles.
const DefaultBuckets = "0,500,2000,8000,32000"

// maxBuckets bounds how many buckets a configuration may ask for; each one multiplies the
// series the aggregator keeps.
const maxBuckets = 32

// Buckets assigns input-token counts to buckets given by their lower bounds. The zero value
// has one bucket holding everything.
type Buckets struct {
	bounds []int64
	labels []string
}

// ParseBuckets parses comma-separated, strictly increasing lower bounds starting at 0, such
// as DefaultBuckets.
func ParseBuckets(s string) (Buckets, error) {
	parts := strings.Split(s, ",")
	if len(parts) > maxBuckets {
		return Buckets{}, fmt.Errorf("cannot parse buckets %q: at most %d bounds", s, maxBuckets)
	}
	bounds := make([]int64, 0, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil {
			return Buckets{}, fmt.Errorf("cannot parse buckets %q: bound %d (%q) is not an integer", s, i+1, p)
		}
		switch {
		case i == 0 && n != 0:
			return Buckets{}, fmt.Errorf("cannot parse buckets %q: the first bound must be 0", s)
		case i > 0 && n <= bounds[i-1]:
			return Buckets{}, fmt.Errorf("cannot parse buckets %q: bounds must increase (%d after %d)", s, n, bounds[i-1])
		}
		bounds = append(bounds, n)
	}
	return newBuckets(bounds), nil
}

func newBuckets(bounds []int64) Buckets {
	labels := make([]string, len(bounds))
	for i, lo := range bounds {
		if i == len(bounds)-1 {
			labels[i] = strconv.FormatInt(lo, 10) + "+"
		} else {
			labels[i] = strconv.FormatInt(lo, 10) + "-" + strconv.FormatInt(bounds[i+1]-1, 10)
		}
	}
	return Buckets{bounds: bounds, labels: labels}
}

// DefaultBucketBounds returns the buckets of DefaultBuckets.
func DefaultBucketBounds() Buckets {
	return newBuckets([]int64{0, 500, 2000, 8000, 32000})
}

// Index returns the bucket of an input-token count. It does not allocate.
func (b Buckets) Index(inputTokens int64) int {
	i := len(b.bounds) - 1
	for i > 0 && inputTokens < b.bounds[i] {
		i--
	}
	return max(i, 0)
}

// Label names bucket i by its inclusive range, such as "500-1999" or "32000+".
func (b Buckets) Label(i int) string {
	if len(b.labels) == 0 {
		return "0+"
	}
	return b.labels[i]
}

// Lower returns bucket i's lower bound in input tokens.
func (b Buckets) Lower(i int) int64 {
	if len(b.bounds) == 0 {
		return 0
	}
	return b.bounds[i]
}

// Len returns the number of buckets.
func (b Buckets) Len() int { return max(len(b.bounds), 1) }

// String returns the bounds in the form ParseBuckets reads.
func (b Buckets) String() string {
	s := make([]string, len(b.bounds))
	for i, n := range b.bounds {
		s[i] = strconv.FormatInt(n, 10)
	}
	return strings.Join(s, ",")
}
