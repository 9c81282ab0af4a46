package bus

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// PublisherOptions tune a Publisher; zero values take the defaults.
type PublisherOptions struct {
	Buffer       int           // messages held while NATS is slow or away (default 100,000)
	Batch        int           // messages in flight at once (default 512)
	AckTimeout   time.Duration // how long to wait for JetStream's ack (default 5s)
	FlushTimeout time.Duration // how long Run keeps publishing after its context ends (default 5s)
	Namespace    string        // metric namespace, such as "emitter"
}

// Publisher publishes to JetStream without ever blocking or failing its callers: Publish
// queues a message in a bounded buffer and returns at once; Run publishes the queue
// asynchronously, retrying with backoff while NATS is away (each message carries a
// Nats-Msg-Id, so a retry can never count twice). When the buffer is full the new message
// is dropped and counted.
type Publisher struct {
	js     jetstream.Publisher
	opts   PublisherOptions
	in     chan *nats.Msg
	logger *slog.Logger

	published prometheus.Counter
	duplicate prometheus.Counter
	dropped   prometheus.Counter
	retried   prometheus.Counter
	buffered  prometheus.GaugeFunc
}

// NewPublisher returns a Publisher on js whose metrics are registered on reg.
func NewPublisher(js jetstream.Publisher, opts PublisherOptions, reg prometheus.Registerer, logger *slog.Logger) *Publisher {
	if opts.Buffer <= 0 {
		opts.Buffer = 100_000
	}
	if opts.Batch <= 0 {
		opts.Batch = 512
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = 5 * time.Second
	}
	if opts.FlushTimeout <= 0 {
		opts.FlushTimeout = 5 * time.Second
	}
	p := &Publisher{js: js, opts: opts, in: make(chan *nats.Msg, opts.Buffer), logger: logger}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: opts.Namespace, Name: name, Help: help})
	}
	p.published = counter("published_total", "Messages JetStream acknowledged.")
	p.duplicate = counter("published_duplicate_total", "Messages JetStream dropped as duplicates of an earlier Nats-Msg-Id.")
	p.dropped = counter("publish_dropped_total", "Messages dropped because the publish buffer was full (NATS away too long) or the service stopped before NATS returned.")
	p.retried = counter("publish_retried_total", "Publish attempts that failed and were retried.")
	p.buffered = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: opts.Namespace, Name: "publish_buffered_messages", Help: "Messages waiting to be published."},
		func() float64 { return float64(len(p.in)) })
	if reg != nil {
		reg.MustRegister(p.published, p.duplicate, p.dropped, p.retried, p.buffered)
	}
	return p
}

// Publish queues data for subject with msgID as its Nats-Msg-Id. It never blocks: it
// returns false, and counts a drop, when the buffer is full.
func (p *Publisher) Publish(subject, msgID string, data []byte) bool {
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{jetstream.MsgIDHeader: []string{msgID}}}
	select {
	case p.in <- m:
		return true
	default:
		p.dropped.Inc()
		return false
	}
}

// Buffered returns how many messages wait to be published.
func (p *Publisher) Buffered() int { return len(p.in) }

// Run publishes until ctx ends, then keeps publishing what is buffered for up to
// FlushTimeout and counts the rest as dropped.
func (p *Publisher) Run(ctx context.Context) error {
	var pending []*nats.Msg
	backoff := time.Duration(0)
	failing := false
	for {
		if len(pending) == 0 {
			select {
			case m := <-p.in:
				pending = append(pending, m)
			case <-ctx.Done():
				return p.flush()
			}
		}
		pending = p.fill(pending)
		pending = p.send(ctx, pending)
		if len(pending) == 0 {
			if failing {
				p.logger.Info("publishing to NATS again")
				failing = false
			}
			backoff = 0
			continue
		}
		if !failing {
			p.logger.Warn("cannot publish to NATS; buffering and retrying", "buffered", len(p.in)+len(pending))
			failing = true
		}
		backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return p.flushFrom(pending)
		}
	}
}

func (p *Publisher) fill(pending []*nats.Msg) []*nats.Msg {
	for len(pending) < p.opts.Batch {
		select {
		case m := <-p.in:
			pending = append(pending, m)
		default:
			return pending
		}
	}
	return pending
}

// send publishes the batch asynchronously and returns the messages that failed.
func (p *Publisher) send(ctx context.Context, batch []*nats.Msg) []*nats.Msg {
	futures := make([]jetstream.PubAckFuture, len(batch))
	var failed []*nats.Msg
	for i, m := range batch {
		m.Reply = "" // set by a failed earlier attempt
		f, err := p.js.PublishMsgAsync(m)
		if err != nil {
			failed = append(failed, m)
			p.retried.Inc()
			continue
		}
		futures[i] = f
	}
	timeout := time.NewTimer(p.opts.AckTimeout)
	defer timeout.Stop()
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				p.duplicate.Inc()
			} else {
				p.published.Inc()
			}
		case <-f.Err():
			failed = append(failed, batch[i])
			p.retried.Inc()
		case <-timeout.C:
			// Unanswered: retry it and the rest; the Nats-Msg-Id makes a late success harmless.
			for j := i; j < len(futures); j++ {
				if futures[j] != nil {
					failed = append(failed, batch[j])
					p.retried.Inc()
				}
			}
			return failed
		case <-ctx.Done():
			for j := i; j < len(futures); j++ {
				if futures[j] != nil {
					failed = append(failed, batch[j])
				}
			}
			return failed
		}
	}
	return failed
}

func (p *Publisher) flush() error { return p.flushFrom(nil) }

// flushFrom publishes pending and the buffer for up to FlushTimeout.
func (p *Publisher) flushFrom(pending []*nats.Msg) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.FlushTimeout)
	defer cancel()
	for {
		pending = p.fill(pending)
		if len(pending) == 0 {
			return nil
		}
		pending = p.send(ctx, pending)
		if len(pending) > 0 && ctx.Err() != nil {
			lost := len(pending) + len(p.in)
			p.dropped.Add(float64(lost))
			for len(p.in) > 0 {
				<-p.in
			}
			return fmt.Errorf("stopped with %d messages unpublished: NATS did not take them in %s", lost, p.opts.FlushTimeout)
		}
		if len(pending) > 0 {
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}
}
