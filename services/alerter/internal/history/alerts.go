package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// RestoreAlerts reads the ALERTS stream from since and returns the alerts whose latest
// state change is firing: the ones a restarted alerter must hold as firing without
// sending them again.
func RestoreAlerts(ctx context.Context, js jetstream.JetStream, since time.Time) ([]events.Alert, error) {
	cons, err := js.OrderedConsumer(ctx, events.StreamAlerts, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.SubjectAlertsAll},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &since,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot read stream %s: %w", events.StreamAlerts, err)
	}
	latest := map[string]events.Alert{}
	var order []string
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, fmt.Errorf("cannot read stream %s: %w", events.StreamAlerts, err)
		}
		got, last := 0, false
		for m := range batch.Messages() {
			got++
			var a events.Alert
			if json.Unmarshal(m.Data(), &a) == nil && a.Fingerprint != "" {
				if _, seen := latest[a.Fingerprint]; !seen {
					order = append(order, a.Fingerprint)
				}
				latest[a.Fingerprint] = a
			}
			if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
				last = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("cannot read stream %s: %w", events.StreamAlerts, err)
		}
		if got == 0 || last {
			break
		}
	}
	var firing []events.Alert
	for _, fp := range order {
		if a := latest[fp]; a.State == events.AlertFiring {
			firing = append(firing, a)
		}
	}
	return firing, nil
}
