package otlp

import (
	"encoding/hex"

	"go.opentelemetry.io/collector/pdata/pcommon"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// setLayer records where the event was measured, the engine's split of its time and the
// trace it belongs to.
func setLayer(ev *events.RequestEvent, k Kind, prefillMs, decodeMs float64, tid pcommon.TraceID) {
	switch k {
	case KindEngine:
		ev.Layer = events.LayerEngine
	case KindApp:
		ev.Layer = events.LayerApp
	}
	ev.PrefillMs, ev.DecodeMs = prefillMs, decodeMs
	ev.TraceID = hex.EncodeToString(tid[:])
}
