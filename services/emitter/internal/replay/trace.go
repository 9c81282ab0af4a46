package replay

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Record is one request of a workload.
type Record struct {
	At     time.Duration // since the workload's first request
	Input  int64         // context (input) tokens
	Output int64         // generated (output) tokens
}

// traceLayout is how Azure's traces write TIMESTAMP (up to 100 ns precision).
const traceLayout = "2006-01-02 15:04:05.999999999"

// ErrBadTrace is wrapped by every error about a trace's content.
var ErrBadTrace = errors.New("bad trace")

// ReadTrace reads a trace in the Azure format: a header TIMESTAMP,ContextTokens,GeneratedTokens
// then one request a line. Records keep the file's order; At is relative to the earliest.
func ReadTrace(r io.Reader) ([]Record, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 3
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("cannot read the trace header: %w: %w", ErrBadTrace, err)
	}
	if strings.TrimPrefix(head[0], "\ufeff") != "TIMESTAMP" || head[1] != "ContextTokens" || head[2] != "GeneratedTokens" {
		return nil, fmt.Errorf("%w: header is %q, want TIMESTAMP,ContextTokens,GeneratedTokens", ErrBadTrace, strings.Join(head, ","))
	}
	var (
		out   []Record
		times []time.Time
		first time.Time
	)
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read trace line %d: %w: %w", line, ErrBadTrace, err)
		}
		ts, err := time.Parse(traceLayout, strings.TrimSpace(rec[0]))
		if err != nil {
			return nil, fmt.Errorf("trace line %d: %w: TIMESTAMP %q is not like 2023-11-16 18:15:46.6805900", line, ErrBadTrace, rec[0])
		}
		in, err1 := strconv.ParseInt(strings.TrimSpace(rec[1]), 10, 64)
		outTok, err2 := strconv.ParseInt(strings.TrimSpace(rec[2]), 10, 64)
		if err1 != nil || err2 != nil || in < 0 || outTok < 0 || in > events.MaxTokens || outTok > events.MaxTokens {
			return nil, fmt.Errorf("trace line %d: %w: token counts %q,%q must be integers from 0 to %d", line, ErrBadTrace, rec[1], rec[2], events.MaxTokens)
		}
		if len(times) == 0 || ts.Before(first) {
			first = ts
		}
		times = append(times, ts)
		out = append(out, Record{Input: in, Output: outTok})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no requests after the header", ErrBadTrace)
	}
	for i := range out {
		out[i].At = times[i].Sub(first)
	}
	return out, nil
}
