package nvmlsource

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// TestNVLinkThroughput: NVLink rates come from the counters' deltas between ticks, so the
// first tick has none; a counter that falls (a driver reload) restarts the deltas.
func TestNVLinkThroughput(t *testing.T) {
	srv, devs := h200(t, 2)
	s, err := New(srv, Options{Recheck: time.Minute}, prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	first := s.Sample(context.Background(), t0, nil)
	if first[0].NVLinkTxBps != nil || first[0].NVLinkRxBps != nil {
		t.Fatalf("NVLink rates on the first tick: %v %v", deref(first[0].NVLinkTxBps), deref(first[0].NVLinkRxBps))
	}
	// Two seconds later, one read of each counter later: half the per-read step per second.
	smp := s.Sample(context.Background(), t0.Add(2*time.Second), nil)[1]
	wantTx := float64(nvlinkStepKiB) * 1024 / 2
	if smp.NVLinkTxBps == nil || math.Abs(*smp.NVLinkTxBps-wantTx) > 1e-6 || smp.NVLinkRxBps == nil || math.Abs(*smp.NVLinkRxBps-wantTx/2) > 1e-6 {
		t.Fatalf("nvlink tx %v rx %v, want %g and %g", deref(smp.NVLinkTxBps), deref(smp.NVLinkRxBps), wantTx, wantTx/2)
	}
	smp.V, smp.TS, smp.Host = events.Version, t0, "dgx"
	if err := smp.ValidateAt(t0); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(s.m.supported.WithLabelValues("1", "nvlink")); v != 1 {
		t.Fatalf("supported{nvlink} = %v", v)
	}
	// Links are counted once, not every tick.
	if n := len(devs[0].GetNvLinkStateCalls()); n != 19 {
		t.Fatalf("GetNvLinkState called %d times, want 19 (18 links and the end)", n)
	}

	devs[0].GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return { // the driver reloaded
		for i := range vals {
			vals[i].ValueType, vals[i].NvmlReturn = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG), uint32(nvml.SUCCESS)
			vals[i].Value = [8]byte{1}
		}
		return nvml.SUCCESS
	}
	if smp := s.Sample(context.Background(), t0.Add(3*time.Second), nil)[0]; smp.NVLinkTxBps != nil {
		t.Fatalf("a rate across a counter reset: %v", *smp.NVLinkTxBps)
	}
	if smp := s.Sample(context.Background(), t0.Add(4*time.Second), nil)[0]; smp.NVLinkTxBps == nil || *smp.NVLinkTxBps != 0 {
		t.Fatalf("after the reset: %v", deref(smp.NVLinkTxBps))
	}
}

// TestNVLinkAbsent: a GPU with no active link (a single-GPU host) or whose NVML does not
// know NVLink has no NVLink readings, is marked unsupported, and is not asked for the
// counters; at the re-check its links are counted again.
func TestNVLinkAbsent(t *testing.T) {
	for _, c := range []struct {
		name  string
		state func(int) (nvml.EnableState, nvml.Return)
	}{
		{"no active link", func(link int) (nvml.EnableState, nvml.Return) {
			if link >= 18 {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}},
		{"not supported", func(int) (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, devs := h200(t, 1)
			devs[0].GetNvLinkStateFunc = c.state
			s, err := New(srv, Options{Recheck: time.Minute}, prometheus.NewRegistry(), discard())
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				smp := s.Sample(context.Background(), t0.Add(time.Duration(i)*time.Second), nil)[0]
				if smp.NVLinkTxBps != nil || smp.NVLinkRxBps != nil {
					t.Fatalf("tick %d: NVLink readings on a GPU without NVLink", i)
				}
			}
			if n := len(devs[0].GetFieldValuesCalls()); n != 0 {
				t.Fatalf("NVLink counters asked %d times", n)
			}
			if v := testutil.ToFloat64(s.m.supported.WithLabelValues("0", "nvlink")); v != 0 {
				t.Fatalf("supported{nvlink} = %v, want 0", v)
			}
			calls := len(devs[0].GetNvLinkStateCalls())
			s.Sample(context.Background(), t0.Add(time.Minute), nil)
			if len(devs[0].GetNvLinkStateCalls()) == calls {
				t.Fatal("links not counted again at the re-check")
			}
		})
	}
}

// TestNVLinkFieldFails: a field value NVML could not read drops NVLink from that tick only.
func TestNVLinkFieldFails(t *testing.T) {
	srv, devs := h200(t, 1)
	s, err := New(srv, Options{Recheck: time.Minute}, prometheus.NewRegistry(), discard())
	if err != nil {
		t.Fatal(err)
	}
	s.Sample(context.Background(), t0, nil)
	good := devs[0].GetFieldValuesFunc
	devs[0].GetFieldValuesFunc = func(vals []nvml.FieldValue) nvml.Return {
		good(vals)
		vals[1].NvmlReturn = uint32(nvml.ERROR_UNKNOWN)
		return nvml.SUCCESS
	}
	if smp := s.Sample(context.Background(), t0.Add(time.Second), nil)[0]; smp.NVLinkTxBps != nil || smp.PowerW == nil {
		t.Fatalf("a failed NVLink read: tx %v, power %v", deref(smp.NVLinkTxBps), deref(smp.PowerW))
	}
	if v := testutil.ToFloat64(s.m.readErrors.WithLabelValues("nvlink", "ERROR_UNKNOWN")); v != 1 {
		t.Fatalf("reading_errors{nvlink,ERROR_UNKNOWN} = %v", v)
	}
	devs[0].GetFieldValuesFunc = good
	if smp := s.Sample(context.Background(), t0.Add(3*time.Second), nil)[0]; smp.NVLinkTxBps == nil {
		t.Fatal("NVLink did not come back")
	}
}
