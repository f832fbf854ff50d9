package client

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/events"
)

// outEvent is one event of a session, built once and published as often as
// it takes: every attempt sends the same id and bytes.
type outEvent struct {
	id      string
	msgID   string // events.MsgID(source, id)
	typ     string
	session string
	msg     *nats.Msg
	// mayBeStored: an attempt was stored, or went out and no answer came
	// back; a later duplicate ack is then this event's own.
	mayBeStored bool
}

// build encodes one input event as a CloudEvent on the session's events
// subject: binary mode (ce-* headers) or structured mode.
func (c *Client) build(session, typ, id string, data any) (*outEvent, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("client: encoding the data of %s: %w", typ, err)
	}
	t := c.now().UTC()
	m := nats.NewMsg(c.subjects.Events(session))
	if c.cfg.Structured {
		body, err := events.MarshalStructured(&events.Event{
			ID: id, Source: c.cfg.Source, Type: typ, Subject: session, Time: t,
			DataContentType: events.ContentTypeJSON, Data: raw,
		})
		if err != nil {
			return nil, fmt.Errorf("client: encoding %s: %w", typ, err)
		}
		m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
		m.Data = body
	} else {
		// Header names as the NATS protocol binding writes them, lower
		// case; values percent-encoded as its draft asks.
		for _, h := range [][2]string{
			{"ce-specversion", "1.0"},
			{"ce-id", id},
			{"ce-source", c.cfg.Source},
			{"ce-type", typ},
			{"ce-subject", session},
			{"ce-time", t.Format(time.RFC3339Nano)},
		} {
			m.Header.Set(h[0], events.PercentEncode(h[1]))
		}
		m.Header.Set("Content-Type", events.ContentTypeJSON)
		m.Data = raw
	}
	return &outEvent{id: id, msgID: events.MsgID(c.cfg.Source, id), typ: typ, session: session, msg: m}, nil
}
