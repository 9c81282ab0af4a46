package events

import (
	"github.com/google/uuid"
)

// NewEventID returns a new UUIDv7: unique, and sortable by creation time, so ids sort the
// way events arrived. It is also the event's Nats-Msg-Id.
func NewEventID() string {
	// NewV7 fails only when crypto/rand does, which since Go 1.24 aborts the program
	// instead of returning an error.
	id, _ := uuid.NewV7()
	return id.String()
}
