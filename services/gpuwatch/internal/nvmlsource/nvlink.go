package nvmlsource

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// nvlinkState is what the previous NVLink reading of a GPU left: the data counters of all
// its links, in KiB, and when they were read. Only the tick touches it.
type nvlinkState struct {
	at     time.Time // zero: nothing to subtract
	tx, rx uint64
}

// nvlinkScope asks NVML for the sum over every link of the GPU (UINT_MAX in scopeId).
const nvlinkScope = math.MaxUint32

// readNVLink stores the GPU's NVLink data throughput, every link together, in bytes per
// second since the previous tick. NVML's NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_* field values
// are counters in KiB, so the first reading (and the first after a counter fell, a driver
// reload) only sets where the next one starts. A GPU without an active link (a single-GPU
// host, a PCIe card) is unsupported like any other missing reading: its links are counted
// on the first try and at each re-check, not every tick.
func (s *Source) readNVLink(g *gpu, now time.Time, smp *events.GPUSample) nvml.Return {
	st := &g.state[fieldNVLink]
	if !st.known || !st.support {
		n, ret := activeLinks(g.dev)
		if ret == nvml.SUCCESS && n == 0 {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
		if ret != nvml.SUCCESS {
			g.nvlink = nvlinkState{}
			return ret
		}
	}
	vals := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: nvlinkScope},
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: nvlinkScope},
	}
	if ret := g.dev.GetFieldValues(vals); ret != nvml.SUCCESS {
		return ret
	}
	var kib [2]uint64
	for i, v := range vals {
		if ret := nvml.Return(v.NvmlReturn); ret != nvml.SUCCESS {
			return ret
		}
		n, ok := fieldUint(v)
		if !ok {
			return outOfRange
		}
		kib[i] = n
	}
	prev := g.nvlink
	g.nvlink = nvlinkState{at: now, tx: kib[0], rx: kib[1]}
	if prev.at.IsZero() || !now.After(prev.at) || kib[0] < prev.tx || kib[1] < prev.rx {
		return nvml.SUCCESS
	}
	dt := now.Sub(prev.at).Seconds()
	smp.NVLinkTxBps = ptr(float64(kib[0]-prev.tx) * 1024 / dt)
	smp.NVLinkRxBps = ptr(float64(kib[1]-prev.rx) * 1024 / dt)
	return nvml.SUCCESS
}

// activeLinks counts the GPU's NVLinks that are up. Link 0 answers for the GPU: not
// supported there means no NVLink at all; past the GPU's last link NVML answers an error.
func activeLinks(d nvml.Device) (int, nvml.Return) {
	n := 0
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := d.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if link == 0 {
				return 0, ret
			}
			break
		}
		if state == nvml.FEATURE_ENABLED {
			n++
		}
	}
	return n, nvml.SUCCESS
}

// fieldUint reads an unsigned field value.
func fieldUint(v nvml.FieldValue) (uint64, bool) {
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG:
		return binary.NativeEndian.Uint64(v.Value[:]), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(v.Value[:4])), true
	}
	return 0, false
}
