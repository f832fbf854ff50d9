package read

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
)

// EventUnverified is the SSE event type of a message on a verdict subject
// that fails verification (see package attest): unsigned, signed by a key
// not trusted, changed, or on another session's subject.
const EventUnverified = "unverified"

// kinds are the verdict kinds, the last token of a verdict subject.
var kinds = []string{events.KindAllowed, events.KindRefused, events.KindSpilled, events.KindHalted, events.KindRejected, events.KindViolation}

// streamQuery is what a verdict stream serves.
type streamQuery struct {
	session string   // "" for every session
	kinds   []string // empty for every kind
	from    string   // "start", "new" or "" when seq is set
	seq     uint64   // the first sequence to send, when from is ""
}

// parseQuery reads the query and the Last-Event-ID header of r.
func parseQuery(r *http.Request) (streamQuery, error) {
	q := r.URL.Query()
	var sq streamQuery
	for _, k := range []string{"session", "kind", "from"} {
		if len(q[k]) > 1 {
			return sq, fmt.Errorf("%s is given %d times; give it once", k, len(q[k]))
		}
	}
	for k := range q {
		if k != "session" && k != "kind" && k != "from" {
			return sq, fmt.Errorf("unknown parameter %q: use session, kind and from", events.Excerpt(k))
		}
	}
	sq.session = q.Get("session")
	if _, given := q["session"]; given && !events.ValidSessionID(sq.session) {
		return sq, fmt.Errorf("session %q is not a session id: use 1 to 128 of the characters A-Z, a-z, 0-9, '_' and '-'", events.Excerpt(sq.session))
	}
	if k := q.Get("kind"); k != "" {
		for _, one := range strings.Split(k, ",") {
			if !slices.Contains(kinds, one) {
				return sq, fmt.Errorf("kind %q: use allowed, refused, spilled, halted, rejected or violation, or several separated by commas", events.Excerpt(one))
			}
			if !slices.Contains(sq.kinds, one) {
				sq.kinds = append(sq.kinds, one)
			}
		}
	}
	switch from := q.Get("from"); from {
	case "", "start":
		sq.from = "start"
	case "new":
		sq.from = "new"
	default:
		n, err := strconv.ParseUint(from, 10, 64)
		if err != nil || n == 0 {
			return sq, fmt.Errorf("from %q: use start, new, or a stream sequence (1 or more)", events.Excerpt(from))
		}
		sq.from, sq.seq = "", n
	}
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		n, err := strconv.ParseUint(strings.TrimSpace(id), 10, 64)
		if err != nil || n == 0 || n == ^uint64(0) {
			return sq, fmt.Errorf("Last-Event-ID %q is not an event id of this stream: a stream sequence", events.Excerpt(id))
		}
		sq.from, sq.seq = "", n+1
	}
	return sq, nil
}

// filter is the subject filter of q: its session and, if it names one,
// its kind.
func (h *Handler) filter(q streamQuery) string {
	kind := "*"
	if len(q.kinds) == 1 {
		kind = q.kinds[0]
	}
	if q.session == "" {
		return h.subj.VerdictsWildcard(kind) // <prefix>.verdicts.*.<kind>
	}
	return h.subj.Verdict(q.session, kind) // <prefix>.verdicts.<session>.<kind>
}

// Verdicts serves GET /v1/verdicts: the verdicts of the verdict stream
// as Server-Sent Events, in stream order, then each new one as it is
// decided, until the client goes away.
//
// Query: session (one session; without it, every session, for operators
// only), kind (allowed, refused, spilled, halted, rejected, violation, or
// several separated by commas), from (start or empty: the first verdict
// the stream holds; new: only verdicts stored after the request; a stream
// sequence: from that one on). A Last-Event-ID header resumes after the
// event id it names, whatever from says.
//
// Each verdict is one event: id its stream sequence, event its CloudEvents
// type, data the structured CloudEvent as the stream holds it. A message
// that fails verification comes as event "unverified" (EventUnverified).
// An idle stream sends a ": ping" comment every Config.Heartbeat.
//
// Answers before the stream: 400 for a malformed query or Last-Event-ID,
// what Access says (401, 403), 503 when Config.MaxStreams streams are
// open, or Config.SessionStreams of the session, or JetStream does not
// answer.
func (h *Handler) Verdicts(w http.ResponseWriter, r *http.Request) {
	q, err := parseQuery(r)
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	if q.session == "" {
		err = h.access.Operator(r)
	} else {
		err = h.access.Session(r, q.session)
	}
	if err != nil {
		deny(w, err)
		return
	}
	select {
	case <-h.closing:
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "the server is shutting down; ask again")
		return
	default:
	}
	if !acquire(w, h.streams, "verdict streams") {
		return
	}
	defer func() { <-h.streams }()
	if !h.openSession(w, q.session) {
		return
	}
	defer h.closeSession(q.session)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	reader, info, err := jsread.Open(ctx, h.js, h.names.Verdicts)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			problem(w, http.StatusServiceUnavailable, "the verdict stream "+h.names.Verdicts+" does not exist yet: is seamguard serving?")
		} else {
			problem(w, http.StatusServiceUnavailable, "JetStream did not answer; ask again")
		}
		return
	}
	from := q.seq
	switch q.from {
	case "start":
		from = info.State.FirstSeq
	case "new":
		from = info.State.LastSeq + 1
	}
	filter := h.filter(q)

	hd := w.Header()
	hd.Set("Content-Type", ContentTypeEventStream)
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	hd.Set("X-Content-Type-Options", "nosniff")
	rc := http.NewResponseController(w)
	h.writeDeadline(rc)
	w.WriteHeader(http.StatusOK)
	if _, err := fmt.Fprintf(w, ": %s from stream sequence %d\n\n", filter, from); err != nil {
		return
	}
	if rc.Flush() != nil {
		return
	}

	// One goroutine follows the stream and hands over each message; this
	// one writes it, and the heartbeats. The follower ends with ctx, and
	// the handler does not return before it has.
	msgs := make(chan *jsread.Msg)
	done := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		done <- reader.Follow(ctx, from, filter, h.cfg.Poll, func(m *jsread.Msg) error {
			select {
			case msgs <- m:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	defer wg.Wait()
	defer cancel()

	beat := orDefault(h.cfg.Heartbeat, DefaultHeartbeat)
	ticker := time.NewTicker(beat)
	defer ticker.Stop()
	var buf bytes.Buffer
	for {
		buf.Reset()
		select {
		case <-ctx.Done():
			return
		case <-h.closing:
			buf.WriteString(": the server is shutting down; reconnect with Last-Event-ID\n\n")
			h.writeDeadline(rc)
			_, _ = w.Write(buf.Bytes())
			_ = rc.Flush()
			return
		case err := <-done:
			if err != nil && ctx.Err() == nil {
				h.log.Warn("read: verdict stream ended", "filter", filter, "err", err)
				buf.WriteString(": the verdict stream could not be read on; reconnect with Last-Event-ID\n\n")
				h.writeDeadline(rc)
				_, _ = w.Write(buf.Bytes())
				_ = rc.Flush()
			}
			return
		case <-ticker.C:
			buf.WriteString(": ping\n\n")
		case m := <-msgs:
			if len(q.kinds) > 1 && !slices.Contains(q.kinds, m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]) {
				continue
			}
			h.event(&buf, m)
			ticker.Reset(beat)
		}
		h.writeDeadline(rc)
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// event writes the SSE event of verdict message m to b.
func (h *Handler) event(b *bytes.Buffer, m *jsread.Msg) {
	b.WriteString("id: " + strconv.FormatUint(m.Seq, 10) + "\n")
	att, err := h.ver.Verify(m.Subject, m.Header, m.Data)
	if err != nil {
		b.WriteString("event: " + EventUnverified + "\n")
		writeData(b, unverified(m, err))
		return
	}
	b.WriteString("event: " + oneLine(att.Verdict.Type) + "\n")
	writeData(b, m.Data)
}

// unverified is the data of an EventUnverified event: why the message
// failed, where it was, and what it claims (its body when that is JSON,
// else its length).
func unverified(m *jsread.Msg, err error) []byte {
	u := struct {
		Reason  string          `json:"reason"`
		Message string          `json:"message"`
		Signer  string          `json:"signer,omitempty"`
		Subject string          `json:"subject"`
		Seq     uint64          `json:"stream_seq"`
		Claims  json.RawMessage `json:"claims,omitempty"`
		Size    int             `json:"size"`
	}{Reason: "unverified", Message: err.Error(), Subject: m.Subject, Seq: m.Seq, Size: len(m.Data)}
	var ae *attest.Error
	if errors.As(err, &ae) {
		u.Reason, u.Message, u.Signer = ae.Reason, ae.Message, ae.Signer
	}
	if json.Valid(m.Data) {
		var c bytes.Buffer
		if json.Compact(&c, m.Data) == nil {
			u.Claims = c.Bytes()
		}
	}
	b, _ := json.Marshal(u)
	return b
}

// writeData writes data as SSE data lines: one per line of data, split at
// CR LF, CR or LF, as the client joins them again with LF. A structured
// CloudEvent is one JSON line, so one data line.
func writeData(b *bytes.Buffer, data []byte) {
	for {
		i := bytes.IndexAny(data, "\r\n")
		if i < 0 {
			break
		}
		b.WriteString("data: ")
		b.Write(data[:i])
		b.WriteByte('\n')
		if data[i] == '\r' && i+1 < len(data) && data[i+1] == '\n' {
			i++
		}
		data = data[i+1:]
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
}

// oneLine is s with line breaks replaced, for an SSE field.
func oneLine(s string) string {
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
}
