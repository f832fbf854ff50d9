package forward

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a kept (undeliverable) verdict, besides the verdict's own
// Content-Type and signature headers, which are kept as they were.
const (
	HeaderName       = "Seamguard-Forward-Name"
	HeaderTo         = "Seamguard-Forward-To"
	HeaderReason     = "Seamguard-Forward-Reason"
	HeaderStatus     = "Seamguard-Forward-Status"
	HeaderAttempts   = "Seamguard-Forward-Attempts"
	HeaderError      = "Seamguard-Forward-Error"
	HeaderFailedAt   = "Seamguard-Forward-Failed-At"
	HeaderSubject    = "Seamguard-Verdict-Subject"
	maxErrorHeader   = 512
	keptSubjectToken = "undeliverable"
)

// Record is one verdict a forwarder could not deliver, as kept.
type Record struct {
	Seq        uint64    `json:"seq"`         // in the undeliverable stream
	Name       string    `json:"name"`        // the forwarder (consumer) name
	To         string    `json:"to"`          // where it was to go
	Reason     string    `json:"reason"`      // ReasonRejected, ...
	Status     int       `json:"status"`      // the last HTTP status; 0 for none
	Attempts   int       `json:"attempts"`    // attempts made
	Error      string    `json:"error"`       // the last failure, in words
	FailedAt   time.Time `json:"failed_at"`   // when it was kept
	Subject    string    `json:"subject"`     // the verdict subject
	VerdictSeq uint64    `json:"verdict_seq"` // in the verdict stream
	Session    string    `json:"session"`
	Kind       string    `json:"kind"`

	msg verdictMsg
}

// Undeliverable is the stream that keeps what forwarders could not
// deliver: <PREFIX>_UNDELIVERABLE, file storage, subjects
// <prefix>.undeliverable.<name>.<session>.<kind>. Safe for concurrent use.
type Undeliverable struct {
	js     jetstream.JetStream
	prefix string
	stream jetstream.Stream
}

// OpenUndeliverable opens the stream of the deployment with prefix, and
// with create makes it (file storage, replicas) when it does not exist.
func OpenUndeliverable(ctx context.Context, js jetstream.JetStream, prefix string, create bool, replicas int) (*Undeliverable, error) {
	if prefix == "" {
		prefix = "seamguard"
	}
	name := UndeliverableStream(prefix)
	u := &Undeliverable{js: js, prefix: prefix}
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) && create {
		s, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        name,
			Description: "seamguard: verdicts a forwarder could not deliver (seamguard forward failed, retry)",
			Subjects:    []string{prefix + "." + keptSubjectToken + ".>"},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardNew,
			Replicas:    max(replicas, 1),
			Duplicates:  2 * time.Minute,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("forward: undeliverable stream %s: %w", name, err)
	}
	u.stream = s
	return u, nil
}

// Name is the stream's name.
func (u *Undeliverable) Name() string { return u.stream.CachedInfo().Config.Name }

// keep stores r (with its verdict) and waits for the stream's ack. The
// message id is the forwarder's name and the verdict's sequence, so that a
// verdict kept twice (kept, then redelivered before its Term) is stored
// once.
func (u *Undeliverable) keep(ctx context.Context, r Record) (uint64, error) {
	session, kind := splitVerdictSubject(u.prefix, r.msg.subject)
	m := nats.NewMsg(u.prefix + "." + keptSubjectToken + "." + r.Name + "." + session + "." + kind)
	m.Data = r.msg.body
	for _, h := range []string{"Content-Type", HeaderSigner, HeaderSignature} {
		if v := r.msg.header.Get(h); v != "" {
			m.Header.Set(h, v)
		}
	}
	m.Header.Set(HeaderName, r.Name)
	m.Header.Set(HeaderTo, oneLine(r.To))
	m.Header.Set(HeaderReason, r.Reason)
	m.Header.Set(HeaderStatus, strconv.Itoa(r.Status))
	m.Header.Set(HeaderAttempts, strconv.Itoa(r.Attempts))
	m.Header.Set(HeaderError, oneLine(r.Error))
	m.Header.Set(HeaderFailedAt, r.FailedAt.UTC().Format(time.RFC3339Nano))
	m.Header.Set(HeaderSubject, r.msg.subject)
	m.Header.Set(HeaderVerdictSeq, strconv.FormatUint(r.msg.seq, 10))
	id := r.Name + ":" + strconv.FormatUint(r.msg.seq, 10)
	ack, err := u.js.PublishMsg(ctx, m, jetstream.WithMsgID(id), jetstream.WithExpectStream(UndeliverableStream(u.prefix)))
	if err != nil {
		return 0, fmt.Errorf("forward: keeping verdict %d in %s: %w", r.msg.seq, UndeliverableStream(u.prefix), err)
	}
	return ack.Sequence, nil
}

// List returns the kept verdicts, oldest first; name "" lists every
// forwarder's.
func (u *Undeliverable) List(ctx context.Context, name string) ([]Record, error) {
	filter := u.prefix + "." + keptSubjectToken + ".>"
	if name != "" {
		filter = u.prefix + "." + keptSubjectToken + "." + name + ".>"
	}
	var out []Record
	for seq := uint64(1); ; {
		m, err := u.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("forward: reading %s: %w", UndeliverableStream(u.prefix), err)
		}
		out = append(out, recordOf(u.prefix, m))
		seq = m.Sequence + 1
	}
}

// Get returns the kept verdict of sequence seq.
func (u *Undeliverable) Get(ctx context.Context, seq uint64) (Record, error) {
	m, err := u.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Record{}, fmt.Errorf("%w: sequence %d", ErrNotKept, seq)
	}
	if err != nil {
		return Record{}, fmt.Errorf("forward: reading %s: %w", UndeliverableStream(u.prefix), err)
	}
	return recordOf(u.prefix, m), nil
}

// Remove deletes the kept verdict of sequence seq.
func (u *Undeliverable) Remove(ctx context.Context, seq uint64) error {
	if err := u.stream.DeleteMsg(ctx, seq); err != nil {
		return fmt.Errorf("forward: removing %d from %s: %w", seq, UndeliverableStream(u.prefix), err)
	}
	return nil
}

func recordOf(prefix string, m *jetstream.RawStreamMsg) Record {
	h := m.Header
	r := Record{Seq: m.Sequence, Name: h.Get(HeaderName), To: h.Get(HeaderTo), Reason: h.Get(HeaderReason),
		Error: h.Get(HeaderError), Subject: h.Get(HeaderSubject)}
	r.Status, _ = strconv.Atoi(h.Get(HeaderStatus))
	r.Attempts, _ = strconv.Atoi(h.Get(HeaderAttempts))
	r.FailedAt, _ = time.Parse(time.RFC3339Nano, h.Get(HeaderFailedAt))
	r.VerdictSeq, _ = strconv.ParseUint(h.Get(HeaderVerdictSeq), 10, 64)
	r.Session, r.Kind = splitVerdictSubject(prefix, r.Subject)
	r.msg = verdictMsg{subject: r.Subject, header: nats.Header{}, body: m.Data, seq: r.VerdictSeq}
	for _, k := range []string{"Content-Type", HeaderSigner, HeaderSignature} {
		if v := h.Get(k); v != "" {
			r.msg.header.Set(k, v)
		}
	}
	return r
}

// splitVerdictSubject returns the session and kind tokens of a verdict
// subject <prefix>.verdicts.<session>.<kind>, or "_invalid" and "unknown".
func splitVerdictSubject(prefix, subject string) (session, kind string) {
	rest, ok := strings.CutPrefix(subject, prefix+".verdicts.")
	s, k, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || s == "" || k == "" || strings.ContainsAny(k, ".*>") || strings.ContainsAny(s, "*>") {
		return "_invalid", "unknown"
	}
	return s, k
}

// oneLine makes s fit a header value: no line breaks, at most
// maxErrorHeader bytes.
func oneLine(s string) string {
	s = strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
	if len(s) > maxErrorHeader {
		s = s[:maxErrorHeader]
	}
	return s
}
