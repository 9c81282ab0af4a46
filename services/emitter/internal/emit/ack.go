package emit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tokenscope/tokenscope/pkg/bus"
)

// AckHeader says when an ingest or OTLP request is answered. By default (and with AckStored)
// the answer waits until JetStream has stored every accepted event, so an emitter killed
// after answering loses none of them; AckBuffered answers as soon as the publisher holds
// them, for a client that would rather lose a few events than wait. gRPC carries it as
// metadata, in lower case.
const (
	AckHeader   = "X-Tokenscope-Ack"
	AckStored   = "stored"
	AckBuffered = "buffered"
)

// Storer is a Publisher that can also say when JetStream has stored what it published;
// bus.Publisher is one.
type Storer interface {
	NewBatch() *bus.Batch
}

// StoreWait returns the batch whose acks a request waits for before it is answered (ack is
// its AckHeader), or nil when it is answered once pub holds its events: asked for with
// AckBuffered, or the only answer a publisher that cannot tell when events are stored can
// give. The error says why the header cannot be met.
func StoreWait(pub Publisher, ack string) (*bus.Batch, error) {
	st, ok := pub.(Storer)
	switch ack = strings.TrimSpace(ack); {
	case ack == "":
		if !ok {
			return nil, nil
		}
	case strings.EqualFold(ack, AckBuffered):
		return nil, nil
	case !strings.EqualFold(ack, AckStored):
		return nil, fmt.Errorf("%s %s is neither %s nor %s", AckHeader, strconv.QuoteToASCII(ack[:min(len(ack), 64)]), AckStored, AckBuffered)
	case !ok:
		return nil, errors.New("this emitter's publisher cannot tell when events are stored: send the request without " + AckHeader)
	}
	return st.NewBatch(), nil
}
