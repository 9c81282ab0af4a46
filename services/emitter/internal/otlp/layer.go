package otlp

import (
	"github.com/tokenscope/tokenscope/pkg/events"
)

// setLayer records where the event was measured, the engine's split of its time and the
// trace it belongs to; ev.EventID is set.
func setLayer(ev *events.RequestEvent, k Kind, prefillMs, decodeMs float64) {
	switch k {
	case KindEngine:
		ev.Layer = events.LayerEngine
	case KindApp:
		ev.Layer = events.LayerApp
	}
	ev.PrefillMs, ev.DecodeMs = prefillMs, decodeMs
	ev.TraceID = ev.EventID[:32] // the event id begins with the trace id in hex
}
