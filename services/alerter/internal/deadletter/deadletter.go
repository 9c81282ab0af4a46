package deadletter

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/tokenscope/tokenscope/pkg/events"
)

// Publisher takes a dead letter; a *nats.Conn is one.
type Publisher interface {
	PublishMsg(m *nats.Msg) error
}

// Publish dead-letters data, read on subject, with its reason and error. Where dead says the
// server's payload limit (a *nats.Conn does), the data is cut to fit it with the headers:
// with them the message can be over it, and would be refused. The headers, the reason among
// them, are kept, and Tokenscope-Truncated says the size of the data.
func Publish(dead Publisher, subject string, data []byte, reason string, err error) error {
	dl := &nats.Msg{Subject: events.SubjectInvalid, Data: data, Header: nats.Header{}}
	dl.Header.Set("Tokenscope-Source", "alerter")
	dl.Header.Set("Tokenscope-Subject", subject)
	dl.Header.Set("Tokenscope-Reason", reason)
	dl.Header.Set("Tokenscope-Error", err.Error())
	truncate(dl, dead)
	return dead.PublishMsg(dl)
}

func truncate(dl *nats.Msg, dead Publisher) {
	mp, ok := dead.(interface{ MaxPayload() int64 })
	if !ok {
		return
	}
	size := len("NATS/1.0\r\n\r\n") + len("Tokenscope-Truncated: 20 digits at most\r\n")
	for k, vs := range dl.Header {
		for _, v := range vs {
			size += len(k) + len(v) + len(": \r\n")
		}
	}
	room := int(mp.MaxPayload()) - size
	if len(dl.Data) <= room {
		return
	}
	dl.Header.Set("Tokenscope-Truncated", strconv.Itoa(len(dl.Data)))
	dl.Data = dl.Data[:max(room, 0)]
}
