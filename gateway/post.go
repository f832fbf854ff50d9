package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/attest"
	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
)

// Headers of the gateway's answers.
const (
	// HeaderMode is the content mode the request was read in: binary,
	// structured or batch.
	HeaderMode = "Seamguard-Mode"
	// HeaderDuplicates counts the events of a 202 that the stream held
	// already (the same event, published before): stored once, not
	// decided again.
	HeaderDuplicates = "Seamguard-Duplicates"
	// HeaderWait says how a ?wait= ended: "verdict" (200) or "timeout"
	// (202).
	HeaderWait = "Seamguard-Wait"
)

// item is one event of a request as the equivalent NATS message: the
// headers it would carry on NATS (ce-* and Content-Type) and its body.
type item struct {
	header nats.Header
	body   []byte
	ev     *events.Event
	msg    *nats.Msg
}

// Stored is one event of a 202's body.
type Stored struct {
	Index     int    `json:"index"`
	ID        string `json:"id"`
	Source    string `json:"source"`
	Type      string `json:"type"`
	Session   string `json:"session"`
	Subject   string `json:"nats_subject"`
	Stream    string `json:"stream"`
	Seq       uint64 `json:"stream_seq"`
	Duplicate bool   `json:"duplicate"`
}

// Accepted is the body of a 202.
type Accepted struct {
	Status int      `json:"status"`
	Mode   string   `json:"mode"`
	Events []Stored `json:"events"`
	// Wait is "timeout" when ?wait= passed without a verdict.
	Wait string `json:"wait,omitempty"`
}

func (s *Server) postEvents(w http.ResponseWriter, r *http.Request) {
	p, err := s.cfg.Auth.Principal(r)
	if err != nil {
		WriteError(w, 0, err)
		return
	}
	var wait time.Duration
	if q := r.URL.Query(); q.Has("wait") {
		if wait, err = parseWait(q.Get("wait")); err != nil {
			WriteError(w, http.StatusBadRequest, err)
			return
		}
	}
	items, mode, status, err := s.read(w, r)
	if err != nil {
		var rej *Rejection
		if errors.As(err, &rej) {
			writeJSON(w, http.StatusBadRequest, events.ContentTypeCloudEventsJSON, rej)
			return
		}
		WriteError(w, status, err)
		return
	}
	w.Header().Set(HeaderMode, mode)
	if fail := s.admit(items, p); fail != nil {
		fail(w)
		return
	}
	if wait > 0 && (len(items) != 1 || items[0].ev.Type != events.TypeCompactionRequested) {
		WriteError(w, http.StatusBadRequest, errors.New("gateway: ?wait= is for a request of exactly one io.seamguard.compaction.requested event; send other events without it"))
		return
	}
	var verdicts chan *nats.Msg
	if wait > 0 {
		ch, done, fail := s.watchVerdicts(r.Context(), items[0].ev.Subject)
		if fail != nil {
			fail(w)
			return
		}
		defer done()
		verdicts = ch
	}
	acc := Accepted{Status: http.StatusAccepted, Mode: mode, Events: make([]Stored, 0, len(items))}
	dups := 0
	for i, it := range items {
		st, status, err := s.publish(r.Context(), i, it)
		if err != nil {
			if i > 0 {
				err = fmt.Errorf("%w; events 0 to %d of the batch are stored, the rest are not: send the whole batch again (each event is deduplicated by its Nats-Msg-Id, so what is stored is not stored twice)", err, i-1)
			}
			s.cfg.Logger.Warn("http gateway: publish failed", "index", i, "session", it.ev.Subject, "id", it.ev.ID, "err", err)
			WriteError(w, status, err)
			return
		}
		if st.Duplicate {
			dups++
		}
		acc.Events = append(acc.Events, st)
	}
	w.Header().Set(HeaderDuplicates, strconv.Itoa(dups))
	if wait > 0 {
		if v := s.awaitVerdict(r.Context(), items[0].ev, acc.Events[0].Duplicate, verdicts, wait); v != nil {
			writeVerdict(w, v)
			return
		}
		w.Header().Set(HeaderWait, "timeout")
		acc.Wait = "timeout"
	}
	writeJSON(w, http.StatusAccepted, "application/json", acc)
}

// failure writes the response of a request that ends early.
type failure func(w http.ResponseWriter)

func failWith(status int, err error) failure {
	return func(w http.ResponseWriter) { WriteError(w, status, err) }
}

func rejectWith(rej *Rejection) failure {
	return func(w http.ResponseWriter) {
		writeJSON(w, http.StatusBadRequest, events.ContentTypeCloudEventsJSON, rej)
	}
}

// admit decodes every item and checks that p may send it, and sets each
// item's event and message; nothing is published before all are admitted:
// a batch is stored whole or not at all as far as validation goes.
func (s *Server) admit(items []item, p Principal) failure {
	firstOf := map[string]int{}
	for i, it := range items {
		ev, rej := s.decode(i, it)
		if rej != nil {
			return rejectWith(rej)
		}
		items[i].ev = ev
		control := ev.Type == events.TypeSessionResumed
		switch {
		case control && p.Role != RoleOperator:
			return failWith(0, fmt.Errorf("%w: event %d (%s %q) is a control event: only an operator token may send session.resumed; token %s has role %s", ErrForbidden, i, ev.Type, ev.ID, p.Name, p.Role))
		case control && s.opJS == nil:
			return failWith(0, fmt.Errorf("%w: event %d is a control event, and this gateway has no operator NATS identity to publish it with (serve --http-operator-*)", ErrForbidden, i))
		case !p.MaySession(ev.Subject):
			return failWith(0, fmt.Errorf("%w: event %d is of session %q, which token %s (role %s) may not reach; its sessions are %s", ErrForbidden, i, ev.Subject, p.Name, p.Role, strings.Join(p.Sessions, " ")))
		}
		// The subject comes from the validated event, never from the
		// request: its session's events subject, or for a resume its
		// control subject (operator only, checked above).
		subject := s.cfg.Subjects.Events(ev.Subject)
		if control {
			subject = s.cfg.Subjects.Control(ev.Subject)
		}
		m := nats.NewMsg(subject)
		m.Header = it.header
		m.Data = it.body
		items[i].msg = m
		key := events.MsgID(ev.Source, ev.ID)
		j, dup := firstOf[key]
		if !dup {
			firstOf[key] = i
			continue
		}
		if diff := events.Diff(items[j].ev, ev); diff != "" {
			e := events.Errorf(events.CodeMalformed, "id",
				"events %d and %d of the batch have the same source %q and id %q but differ in %s; an event is (source, id): give each event its own id", j, i, ev.Source, ev.ID, diff)
			rej := rejection(i, e, ev.Subject, ev.ID, events.Meta{Subject: subject})
			return rejectWith(&rej)
		}
	}
	return nil
}

// watchVerdicts takes one of the gateway's waiting slots and subscribes to
// session's verdicts, before the request is published, so that no verdict
// is missed; done gives both back.
func (s *Server) watchVerdicts(ctx context.Context, session string) (verdicts chan *nats.Msg, done func(), fail failure) {
	select {
	case s.waiting <- struct{}{}:
	default:
		return nil, nil, func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "1")
			WriteError(w, http.StatusServiceUnavailable, fmt.Errorf("gateway: %d requests are waiting for verdicts already, the most this gateway lets wait; send the request again without ?wait= (and read its verdict on NATS), or later", cap(s.waiting)))
		}
	}
	verdicts = make(chan *nats.Msg, 64)
	sub, err := s.cfg.Agent.ChanSubscribe(s.cfg.Subjects.Verdict(session, "*"), verdicts)
	if err == nil {
		fctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
		err = s.cfg.Agent.FlushWithContext(fctx)
		cancel()
	}
	if err != nil {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		<-s.waiting
		return nil, nil, failWith(http.StatusServiceUnavailable, fmt.Errorf("gateway: cannot subscribe to the session's verdicts: %w", err))
	}
	return verdicts, func() { _ = sub.Unsubscribe(); <-s.waiting }, nil
}

// writeVerdict answers with the verdict v, its signature headers kept.
func writeVerdict(w http.ResponseWriter, v *nats.Msg) {
	for _, h := range []string{attest.HeaderSigner, attest.HeaderSignature} {
		if val := v.Header.Get(h); val != "" {
			w.Header().Set(h, val)
		}
	}
	w.Header().Set(HeaderWait, "verdict")
	w.Header().Set("Content-Type", events.ContentTypeCloudEventsJSON)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(v.Data)
}

// parseWait reads ?wait=: a Go duration (e.g. 10s, 1m) or whole seconds,
// above 0 and at most MaxWait.
func parseWait(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		n, nerr := strconv.Atoi(v)
		if nerr != nil {
			return 0, fmt.Errorf("gateway: ?wait=%q is not a duration; use e.g. wait=10s (at most %s)", v, MaxWait)
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 || d > MaxWait {
		return 0, fmt.Errorf("gateway: ?wait=%s is out of range; use more than 0 and at most %s", v, MaxWait)
	}
	return d, nil
}

// read takes the request's events apart with the CloudEvents HTTP binding
// of sdk-go: its mode, then each event as the NATS message it would be.
// Bodies are bounded: a single event by MaxEventBytes, a batch by
// MaxBatchBytes (413 past either).
func (s *Server) read(w http.ResponseWriter, r *http.Request) ([]item, string, int, error) {
	batch := false
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && format.Lookup(mt) == format.JSONBatch {
			batch = true
		}
	}
	limit := s.cfg.MaxEventBytes
	if batch {
		limit = s.cfg.MaxBatchBytes
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	msg := cehttp.NewMessageFromHttpRequest(r)
	defer func() { _ = msg.Finish(nil) }()
	tooLarge := func(err error) (int, error) { return bodyFailure(err, batch) }
	switch enc := msg.ReadEncoding(); enc {
	case binding.EncodingBinary:
		c := &collector{header: nats.Header{}}
		if err := msg.ReadBinary(r.Context(), c); err != nil {
			st, err := tooLarge(err)
			return nil, "binary", st, err
		}
		// sdk-go passes on a header's first value; NATS decoding sees them
		// all, and rejects one given twice with different values.
		for k, vs := range r.Header {
			if lk := strings.ToLower(k); len(vs) > 1 && (strings.HasPrefix(lk, "ce-") || lk == "content-type") {
				c.header[nameOf(lk)] = vs
			}
		}
		return []item{{header: c.header, body: c.body}}, "binary", 0, nil
	case binding.EncodingStructured:
		c := &collector{header: nats.Header{}}
		if err := msg.ReadStructured(r.Context(), c); err != nil {
			st, err := tooLarge(err)
			return nil, "structured", st, err
		}
		h := ceHeaders(r.Header) // a structured event with ce-* headers is checked against them, as on NATS
		h["Content-Type"] = []string{r.Header.Get("Content-Type")}
		return []item{{header: h, body: c.body}}, "structured", 0, nil
	case binding.EncodingBatch:
		items, st, err := s.readBatch(r, msg)
		return items, "batch", st, err
	default:
		// Not a CloudEvent the binding recognises (no or an unknown
		// ce-specversion, no CloudEvents media type): decoded as the same
		// NATS message would be, so that it is rejected with the same
		// code and field.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			st, err := tooLarge(err)
			return nil, "unknown", st, err
		}
		h := ceHeaders(r.Header)
		if ct := r.Header.Values("Content-Type"); len(ct) > 0 {
			h["Content-Type"] = ct
		}
		mode := "structured"
		if len(h) > 1 || (len(h) == 1 && h.Get("Content-Type") == "") {
			mode = "binary"
		}
		return []item{{header: h, body: body}}, mode, 0, nil
	}
}

// bodyFailure is the status and error of a request body that could not be
// read: 413 past its bound (of a batch when batch), 400 otherwise.
func bodyFailure(err error, batch bool) (int, error) {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		what := "an event"
		if batch {
			what = "a batch"
		}
		return http.StatusRequestEntityTooLarge, fmt.Errorf("gateway: the request body is over %d bytes, the most %s may take here (events are bounded like NATS messages: the server's max_payload); shorten the event (a turn's content may be a reference to the full text) or split the batch", mb.Limit, what)
	}
	return http.StatusBadRequest, fmt.Errorf("gateway: cannot read the request body: %w", err)
}

// readBatch takes a batch (a JSON array of structured events) apart into
// one item each; a batch that is not one is rejected, one of too many
// events refused (413).
func (s *Server) readBatch(r *http.Request, msg *cehttp.Message) ([]item, int, error) {
	body, err := io.ReadAll(msg.BodyReader)
	if err != nil {
		st, err := bodyFailure(err, true)
		return nil, st, err
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		e := events.Errorf(events.CodeMalformed, "", "a batch (%s) must be a JSON array of structured CloudEvents: %v", r.Header.Get("Content-Type"), err)
		rej := rejection(-1, e, "", "", events.Meta{})
		return nil, 0, &rej
	}
	if len(raws) == 0 {
		e := events.Errorf(events.CodeMalformed, "", "the batch is empty; send at least one event")
		rej := rejection(-1, e, "", "", events.Meta{})
		return nil, 0, &rej
	}
	if len(raws) > s.cfg.MaxBatchEvents {
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("gateway: the batch holds %d events, more than the %d one batch may; split it", len(raws), s.cfg.MaxBatchEvents)
	}
	items := make([]item, len(raws))
	for i, raw := range raws {
		items[i] = item{header: nats.Header{"Content-Type": {events.ContentTypeCloudEventsJSON}}, body: raw}
	}
	return items, 0, nil
}

// nameOf is the NATS header name of a lower-case HTTP header name.
func nameOf(lk string) string {
	if lk == "content-type" {
		return "Content-Type"
	}
	return lk
}

// ceHeaders returns the ce-* headers of h, every value, under lower-case
// names: nothing else of an HTTP request (its Authorization above all)
// goes into the stream.
func ceHeaders(h http.Header) nats.Header {
	out := nats.Header{}
	for k, vs := range h {
		if lk := strings.ToLower(k); strings.HasPrefix(lk, "ce-") {
			out[lk] = append(out[lk], vs...)
		}
	}
	return out
}

// collector receives an event from sdk-go's binding as the NATS message it
// would be: binary-mode attributes as ce-* headers (their values as sent),
// the data content type as Content-Type, and the body.
type collector struct {
	header nats.Header
	body   []byte
}

func (c *collector) Start(context.Context) error { return nil }
func (c *collector) End(context.Context) error   { return nil }

func (c *collector) SetAttribute(a spec.Attribute, v any) error {
	if a.Kind() == spec.DataContentType {
		c.header["Content-Type"] = []string{fmt.Sprint(v)}
		return nil
	}
	c.header["ce-"+a.Name()] = []string{fmt.Sprint(v)}
	return nil
}

func (c *collector) SetExtension(name string, v any) error {
	c.header["ce-"+strings.ToLower(name)] = []string{fmt.Sprint(v)}
	return nil
}

func (c *collector) SetData(r io.Reader) error {
	b, err := io.ReadAll(r)
	c.body = b
	return err
}

func (c *collector) SetStructuredEvent(_ context.Context, _ format.Format, r io.Reader) error {
	return c.SetData(r)
}

// decode validates one event with the project's decoder, on the NATS
// subject it claims (its subject attribute), exactly as the processor
// would decode it from NATS: the same inputs fail, with the same code and
// field.
func (s *Server) decode(i int, it item) (*events.Event, *Rejection) {
	session := claimedSession(it.header, it.body)
	subject := s.cfg.Subjects.Events(session)
	echo, omitted := events.EchoHeaders(it.header)
	meta := events.Meta{Subject: subject, Headers: echo, HeadersOmitted: omitted}
	if session == events.InvalidSession {
		meta.Subject = ""
		session = ""
	}
	if size := int64(len(it.body) + headerSize(it.header)); size > s.cfg.MaxEventBytes {
		e := events.Errorf(events.CodeTooLarge, "", "the event takes %d bytes as a NATS message, more than the %d the server takes (max_payload); shorten its content (a turn's content may be a reference to the full text)", size, s.cfg.MaxEventBytes)
		rej := rejection(i, e, session, events.ReadableID(it.header, it.body), meta)
		return nil, &rej
	}
	ev, err := events.DecodeMsg(subject, it.header, it.body, s.cfg.Subjects)
	if err != nil {
		var e *events.Error
		if !errors.As(err, &e) {
			e = &events.Error{Code: events.CodeMalformed, Message: err.Error()}
		}
		rej := rejection(i, e, session, events.ReadableID(it.header, it.body), meta)
		return nil, &rej
	}
	return ev, nil
}

// claimedSession is the session an event names in its subject attribute
// (ce-subject in binary mode, "subject" in structured mode), or
// events.InvalidSession when it names no valid one. Decoding checks the
// claim against the event; the subject published on is built from the
// decoded event alone.
func claimedSession(h nats.Header, body []byte) string {
	ct, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	var s string
	if vs := h.Values("ce-specversion"); len(vs) > 0 && ct != events.ContentTypeCloudEventsJSON {
		s = h.Get("ce-subject")
		if d, err := url.PathUnescape(s); err == nil {
			s = d
		}
	} else {
		var env struct {
			Subject json.RawMessage `json:"subject"`
		}
		if json.Unmarshal(body, &env) == nil && len(env.Subject) > 0 {
			_ = json.Unmarshal(env.Subject, &s)
		}
	}
	if !events.ValidSessionID(s) {
		return events.InvalidSession
	}
	return s
}

func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// publish stores one event with Nats-Msg-Id events.MsgID(source, id) and
// waits for the stream's ack. A duplicate ack is read back and compared:
// the same event published before is fine, another one under the same
// (source, id) is a 409.
func (s *Server) publish(ctx context.Context, i int, it item) (Stored, int, error) {
	ev := it.ev
	js := s.agentJS
	if s.cfg.Subjects.IsControl(it.msg.Subject) {
		js = s.opJS
	}
	msgID := events.MsgID(ev.Source, ev.ID)
	actx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	ack, err := js.PublishMsg(actx, it.msg, jetstream.WithMsgID(msgID), jetstream.WithExpectStream(s.cfg.EventsStream))
	cancel()
	st := Stored{Index: i, ID: ev.ID, Source: ev.Source, Type: ev.Type, Session: ev.Subject, Subject: it.msg.Subject}
	if err != nil {
		status := http.StatusServiceUnavailable
		var api *jetstream.APIError
		if errors.As(err, &api) {
			status = http.StatusBadGateway
		}
		return st, status, fmt.Errorf("gateway: event %d (%s %q) was not stored on %s: %w", i, ev.Type, ev.ID, it.msg.Subject, err)
	}
	st.Stream, st.Seq, st.Duplicate = ack.Stream, ack.Sequence, ack.Duplicate
	if !ack.Duplicate {
		return st, 0, nil
	}
	if err := s.sameAsStored(ctx, ev, ack); err != nil {
		return st, http.StatusConflict, fmt.Errorf("gateway: event %d (%s %q of source %q) was not stored: %w", i, ev.Type, ev.ID, ev.Source, err)
	}
	return st, 0, nil
}

// sameAsStored checks that the message the stream holds under ev's message
// id is ev.
func (s *Server) sameAsStored(ctx context.Context, ev *events.Event, ack *jetstream.PubAck) error {
	if s.cfg.Reader == nil {
		return fmt.Errorf("the events stream holds a message under its (source, id) already (sequence %d), and this gateway cannot read it to compare; give the event a new id", ack.Sequence)
	}
	gctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
	defer cancel()
	// Read from the stream's leader: the events stream allows direct
	// gets, which a replica behind the leader may answer without it.
	raw, err := jsread.LeaderGet(gctx, s.cfg.Reader.Conn(), ack.Stream, ack.Sequence, "")
	if err == nil && raw == nil {
		err = errors.New("the stream no longer holds it")
	}
	if err != nil {
		return fmt.Errorf("the events stream holds a message under its (source, id) already (sequence %d), which could not be read to compare: %w", ack.Sequence, err)
	}
	stored, err := events.DecodeMsg(raw.Subject, raw.Header, raw.Data, s.cfg.Subjects)
	if err != nil {
		return fmt.Errorf("the events stream holds another message under its (source, id) (sequence %d, not a valid event); give the event a new id", ack.Sequence)
	}
	if diff := events.Diff(stored, ev); diff != "" {
		return fmt.Errorf("the events stream holds another event with the same source and id (sequence %d), which differs in %s; an event is (source, id): give this one a new id", ack.Sequence, diff)
	}
	return nil
}

// verdictTypes are the outputs that answer a compaction request.
var verdictTypes = []struct{ typ, kind string }{
	{events.TypeCompactionAllowed, events.KindAllowed},
	{events.TypeCompactionRefused, events.KindRefused},
	{events.TypeSessionHalted, events.KindHalted},
	{events.TypeEventRejected, events.KindRejected},
}

// awaitVerdict waits up to d for the verdict that answers req, whose
// output ids events.OutputID derives from its source and id. A request
// stored before (duplicate) was decided before, maybe: its verdict is
// looked up among the session's last verdicts too.
func (s *Server) awaitVerdict(ctx context.Context, req *events.Event, duplicate bool, ch <-chan *nats.Msg, d time.Duration) *nats.Msg {
	cause := events.Cause{ID: req.ID, Source: req.Source}
	ids := map[string]bool{}
	for _, vt := range verdictTypes {
		ids[events.OutputID(cause, vt.typ)] = true
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if duplicate && s.cfg.Verdicts != nil {
		if str, err := s.cfg.Verdicts.Stream(ctx, s.cfg.VerdictsStream); err == nil {
			for _, vt := range verdictTypes {
				raw, err := str.GetLastMsgForSubject(ctx, s.cfg.Subjects.Verdict(req.Subject, vt.kind))
				if err == nil && ids[verdictID(raw.Data)] {
					return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
				}
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			if ids[verdictID(m.Data)] {
				return m
			}
		}
	}
}

func verdictID(b []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(b, &v)
	return v.ID
}
