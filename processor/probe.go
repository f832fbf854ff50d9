package processor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/internal/jsread"
)

// This file holds the prefetch's lookups of the events stream: where a
// session's next message is, read whole only when a catch-up may apply it.
//
// Checking a state just read against the stream (catchup.go) finds, almost
// always, the input at hand: the answer's sequence is all that is needed,
// and decoding its body and headers from the answer's JSON and base64 is
// most of what a lookup costs the processor. A lookup here reads the
// answer's subject and sequence, and decodes the rest only when want says
// the message may be applied; a message read for its position only is
// marked as such, and read again by sequence if a catch-up does come to
// apply it.

// lookupWait bounds one lookup when its context has no deadline.
const lookupWait = 5 * time.Second

// findNext returns the first message of the events stream at or after seq
// whose subject matches filter (nil when there is none), whole when want
// says so of its sequence and otherwise with its subject and sequence only
// (position true).
func (p *Processor) findNext(ctx context.Context, seq uint64, filter string, want func(uint64) bool) (raw *jetstream.RawStreamMsg, position bool, err error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, lookupWait)
		defer cancel()
	}
	body, err := json.Marshal(struct {
		Seq    uint64 `json:"seq"`
		NextBy string `json:"next_by_subj"`
	}{seq, filter})
	if err != nil {
		return nil, false, err
	}
	reply, err := p.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+p.cfg.Names().Events, body)
	if err != nil {
		return nil, false, fmt.Errorf("processor: looking up %s from %d: %w", filter, seq, err)
	}
	subject, found, perr := positionOf(reply.Data)
	if perr == nil && !want(found) {
		return &jetstream.RawStreamMsg{Subject: subject, Sequence: found}, true, nil
	}
	raw, err = decodeMsgGet(p.cfg.Names().Events, reply.Data)
	return raw, false, err
}

// positionOf reads the subject and sequence of the message in a
// STREAM.MSG.GET answer, errPositionAnswer when the answer is anything but
// a message in the server's usual form.
func positionOf(data []byte) (subject string, seq uint64, err error) {
	i := bytes.Index(data, []byte(`"message":{`))
	if i < 0 || bytes.Contains(data[:i], []byte(`"error"`)) {
		return "", 0, errPositionAnswer
	}
	msg := data[i:]
	// Base64 and a subject hold no quote, so the first of each key after
	// "message" is the field.
	j := bytes.Index(msg, []byte(`"subject":"`))
	k := bytes.Index(msg, []byte(`"seq":`))
	if j < 0 || k < 0 {
		return "", 0, errPositionAnswer
	}
	subj := msg[j+len(`"subject":"`):]
	end := bytes.IndexByte(subj, '"')
	if end <= 0 || bytes.IndexByte(subj[:end], '\\') >= 0 {
		return "", 0, errPositionAnswer // escaped: read the general way
	}
	digits := msg[k+len(`"seq":`):]
	n := 0
	for n < len(digits) && digits[n] >= '0' && digits[n] <= '9' {
		n++
	}
	seq, perr := strconv.ParseUint(string(digits[:n]), 10, 64)
	if perr != nil || seq == 0 {
		return "", 0, errPositionAnswer
	}
	return string(subj[:end]), seq, nil
}

// decodeMsgGet reads a STREAM.MSG.GET answer from stream whole: the
// message, nil when the stream has none there, or the server's error.
func decodeMsgGet(stream string, data []byte) (*jetstream.RawStreamMsg, error) {
	m, err := jsread.DecodeMsgGet(stream, data)
	if err != nil || m == nil {
		return nil, err
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Seq, Header: m.Header, Data: m.Data, Time: m.Time}, nil
}
