package sink

import (
	"time"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Requests buffers request events for the requests table, column by column, so that adding
// one does not allocate once the columns have grown.
type Requests struct {
	ts                                          []time.Time
	eventID, env, scene, model, instance        []string
	tenant, provider, bucket, status, errorCode []string
	conversationID, outcome                     []string
	input, output, cached, turn                 []uint32
	estimated, stream                           []uint8
	httpStatus                                  []uint16
	ttft, total, tpot, maxITL, queue, cost      []float64
	hasTPOT                                     []bool
	seq                                         []uint64
}

// Add appends one event. Its strings are kept as they are: the caller must not reuse the
// memory they point into until the batch is written (a NATS message's payload is never
// reused).
func (r *Requests) Add(ev *events.RequestEvent, bucket string, cost float64, seq uint64) {
	r.ts = append(r.ts, ev.TS)
	r.eventID = append(r.eventID, ev.EventID)
	r.env = append(r.env, ev.Env)
	r.scene = append(r.scene, ev.Scene)
	r.model = append(r.model, ev.Model)
	r.instance = append(r.instance, ev.Instance)
	r.tenant = append(r.tenant, ev.Tenant)
	r.provider = append(r.provider, ev.Provider)
	r.bucket = append(r.bucket, bucket)
	r.status = append(r.status, string(ev.Status))
	r.errorCode = append(r.errorCode, ev.ErrorCode)
	r.conversationID = append(r.conversationID, ev.ConversationID)
	r.outcome = append(r.outcome, string(ev.Outcome))
	r.input = append(r.input, uint32(ev.InputTokens))
	r.output = append(r.output, uint32(ev.OutputTokens))
	r.cached = append(r.cached, uint32(ev.CachedInputTokens))
	r.turn = append(r.turn, uint32(ev.Turn))
	r.estimated = append(r.estimated, b2u8(ev.TokensEstimated))
	r.stream = append(r.stream, b2u8(ev.Stream))
	r.httpStatus = append(r.httpStatus, uint16(ev.HTTPStatus))
	r.ttft = append(r.ttft, ev.TTFTMs)
	r.total = append(r.total, ev.TotalMs)
	tpot, ok := ev.TPOT()
	r.tpot = append(r.tpot, tpot)
	r.hasTPOT = append(r.hasTPOT, ok)
	r.maxITL = append(r.maxITL, ev.MaxITLMs)
	r.queue = append(r.queue, ev.QueueMs)
	r.cost = append(r.cost, cost)
	r.seq = append(r.seq, seq)
}

// Len returns the number of buffered events.
func (r *Requests) Len() int { return len(r.seq) }

// SeqRange returns the first and last stream positions buffered.
func (r *Requests) SeqRange() (lo, hi uint64) {
	if len(r.seq) == 0 {
		return 0, 0
	}
	return r.seq[0], r.seq[len(r.seq)-1]
}

// Reset empties the buffer, keeping its storage.
func (r *Requests) Reset() {
	r.ts = r.ts[:0]
	for _, s := range []*[]string{&r.eventID, &r.env, &r.scene, &r.model, &r.instance, &r.tenant, &r.provider, &r.bucket, &r.status, &r.errorCode, &r.conversationID, &r.outcome} {
		clear(*s) // drop references to message payloads
		*s = (*s)[:0]
	}
	r.input, r.output, r.cached, r.turn = r.input[:0], r.output[:0], r.cached[:0], r.turn[:0]
	r.estimated, r.stream, r.httpStatus = r.estimated[:0], r.stream[:0], r.httpStatus[:0]
	r.ttft, r.total, r.tpot, r.maxITL, r.queue, r.cost = r.ttft[:0], r.total[:0], r.tpot[:0], r.maxITL[:0], r.queue[:0], r.cost[:0]
	r.hasTPOT, r.seq = r.hasTPOT[:0], r.seq[:0]
}

func b2u8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
