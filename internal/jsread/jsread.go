package jsread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of Reader.
const (
	DefaultBatch    = 1024
	DefaultMaxBytes = 4 << 20
	DefaultWindow   = 256
	DefaultTimeout  = 10 * time.Second
	DefaultPoll     = time.Second
)

var (
	// ErrNoAnswer is returned (wrapped) when a get request is not answered
	// within Reader.Timeout: a server refusing the request for
	// permissions answers nothing.
	ErrNoAnswer = errors.New("jsread: no answer")
	// ErrNoDirect is returned (wrapped) when nothing answers a direct get:
	// the stream does not allow direct gets, or does not exist.
	ErrNoDirect = errors.New("jsread: the stream answers no direct get")

	errNoResponders = errors.New("jsread: no responders")
)

// Reader reads one stream without a consumer. JS and Stream are
// required; the zero value of every other field means its default.
type Reader struct {
	JS     jetstream.JetStream
	Stream string
	// Direct reads with batched direct gets; set it only for a stream
	// with allow_direct (Open sets it from the stream's config).
	Direct bool
	// Confirm has an end that direct gets report before the range asked
	// for ends confirmed by the stream's leader (STREAM.MSG.GET), which a
	// replica lagging its leader would otherwise make look early. Open
	// sets it; an identity without STREAM.MSG.GET on the stream leaves it
	// unset and checks what it read itself.
	Confirm bool
	// Batch is the most messages one direct get answers (default 1024);
	// MaxBytes the bytes after which its answer stops (default 4 MiB, and
	// at least one message is always sent).
	Batch, MaxBytes int
	// Window is how many STREAM.MSG.GET requests for consecutive sequences
	// an unfiltered read keeps in flight (default 256).
	Window int
	// Timeout bounds each wait for an answer (default 10s).
	Timeout time.Duration
}

// Msg is one stored message.
type Msg struct {
	Subject string
	Seq     uint64
	Time    time.Time
	Header  nats.Header // the message's own headers, without the Nats-* ones a get adds
	Data    []byte
}

// Open looks stream up (STREAM.INFO) and returns a Reader of it, direct
// if the stream allows direct gets, with Confirm set, and the stream's
// info: its state says which sequences there are to read. A missing
// stream is an error wrapping jetstream.ErrStreamNotFound.
func Open(ctx context.Context, js jetstream.JetStream, stream string) (*Reader, *jetstream.StreamInfo, error) {
	str, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, nil, fmt.Errorf("jsread: stream %s: %w", stream, err)
	}
	info := str.CachedInfo()
	return New(js, info), info, nil
}

// New returns a Reader of the stream info describes, direct if it allows
// direct gets, with Confirm set.
func New(js jetstream.JetStream, info *jetstream.StreamInfo) *Reader {
	return &Reader{JS: js, Stream: info.Config.Name, Direct: info.Config.AllowDirect, Confirm: true}
}

func (r *Reader) batch() int {
	if r.Batch > 0 {
		return r.Batch
	}
	return DefaultBatch
}

func (r *Reader) maxBytes() int {
	if r.MaxBytes > 0 {
		return r.MaxBytes
	}
	return DefaultMaxBytes
}

func (r *Reader) window() uint64 {
	if r.Window > 0 {
		return uint64(r.Window)
	}
	return DefaultWindow
}

func (r *Reader) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return DefaultTimeout
}

func (r *Reader) check(filters []string) error {
	var errs []error
	if r.JS == nil {
		errs = append(errs, errors.New("jsread: Reader.JS is nil"))
	}
	if r.Stream == "" || strings.ContainsAny(r.Stream, ".*> \t\r\n") {
		errs = append(errs, fmt.Errorf("jsread: Reader.Stream %q is not a stream name", r.Stream))
	}
	for _, f := range filters {
		if f == "" || strings.ContainsAny(f, " \t\r\n") || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") || strings.Contains(f, "..") {
			errs = append(errs, fmt.Errorf("jsread: filter %q is not a subject", f))
		}
	}
	return errors.Join(errs...)
}

// Read calls fn with every message of the stream whose sequence is in
// [from, to] and whose subject matches one of filters (every message when
// there are none), in sequence order, each once. It returns fn's first
// error. It reads what the stream holds now and never waits for more:
// pass the stream's last sequence (its info) as to, or math.MaxUint64 for
// whatever is there.
//
// A direct Reader with at most one filter reads with batched direct gets;
// otherwise each message is a STREAM.MSG.GET (see the package doc).
func (r *Reader) Read(ctx context.Context, from, to uint64, filters []string, fn func(*Msg) error) error {
	if err := r.check(filters); err != nil {
		return err
	}
	from = max(from, 1)
	if to < from {
		return nil
	}
	ib, err := r.openInbox()
	if err != nil {
		return err
	}
	defer ib.close()
	switch {
	case r.Direct && len(filters) <= 1:
		filter := ""
		if len(filters) == 1 {
			filter = filters[0]
		}
		_, err = r.readDirect(ctx, ib, from, to, filter, fn)
	case len(filters) == 0:
		// Sequences are asked for one by one: only those the stream has.
		var str jetstream.Stream
		if str, err = r.JS.Stream(ctx, r.Stream); err != nil {
			return fmt.Errorf("jsread: stream %s: %w", r.Stream, err)
		}
		st := str.CachedInfo().State
		if from, to = max(from, st.FirstSeq), min(to, st.LastSeq); from <= to {
			err = r.readSeqs(ctx, ib, from, to, fn)
		}
	default:
		err = r.readFilters(ctx, ib, from, to, filters, fn)
	}
	return err
}

// inbox is one read's reply subscription: every request of the read
// answers on prefix.<token>, a token per request.
type inbox struct {
	nc     *nats.Conn
	prefix string
	sub    *nats.Subscription
	n      uint64
}

func (r *Reader) openInbox() (*inbox, error) {
	nc := r.JS.Conn()
	prefix := nc.NewInbox()
	sub, err := nc.SubscribeSync(prefix + ".*")
	if err != nil {
		return nil, fmt.Errorf("jsread: subscribe to the reply inbox: %w", err)
	}
	// A batch answers at most MaxBytes plus one message; more may queue
	// while fn works.
	_ = sub.SetPendingLimits(-1, 256<<20)
	return &inbox{nc: nc, prefix: prefix, sub: sub}, nil
}

func (ib *inbox) close() { _ = ib.sub.Unsubscribe() }

// request publishes body to subject with a reply subject of its own, and
// returns that reply subject's token.
func (ib *inbox) request(subject string, body []byte) (string, error) {
	ib.n++
	token := strconv.FormatUint(ib.n, 10)
	if err := ib.nc.PublishRequest(subject, ib.prefix+"."+token, body); err != nil {
		return "", fmt.Errorf("jsread: request %s: %w", subject, err)
	}
	return token, nil
}

// next returns the next answer and its token, waiting at most d.
func (ib *inbox) next(ctx context.Context, d time.Duration, stream string) (*nats.Msg, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	// An answer already there needs no timer of its own.
	if m, err := ib.sub.NextMsg(0); err == nil {
		return m, m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], nil
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	m, err := ib.sub.NextMsgWithContext(wctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, "", fmt.Errorf("%w: nothing answers requests for stream %s", errNoResponders, stream)
		}
		if wctx.Err() != nil {
			return nil, "", fmt.Errorf("%w from stream %s within %s (is the read allowed to this identity?)", ErrNoAnswer, stream, d)
		}
		return nil, "", fmt.Errorf("jsread: read answers from stream %s: %w", stream, err)
	}
	return m, m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], nil
}

// getRequest is the body of STREAM.MSG.GET and DIRECT.GET.
type getRequest struct {
	Seq      uint64 `json:"seq,omitempty"`
	NextFor  string `json:"next_by_subj,omitempty"`
	Batch    int    `json:"batch,omitempty"`
	MaxBytes int    `json:"max_bytes,omitempty"`
}

// readDirect reads [from, to] on filter with batched direct gets, and
// returns the sequence after the last message it delivered.
func (r *Reader) readDirect(ctx context.Context, ib *inbox, from, to uint64, filter string, fn func(*Msg) error) (uint64, error) {
	subject := "$JS.API.DIRECT.GET." + r.Stream
	seq := from
	// Each pass either delivers a message at seq or later (and moves seq
	// past it), or ends the read.
	for seq <= to {
		body, _ := json.Marshal(getRequest{Seq: seq, NextFor: filter, Batch: r.batch(), MaxBytes: r.maxBytes()})
		token, err := ib.request(subject, body)
		if err != nil {
			return seq, err
		}
		var pending uint64
		end, got := false, 0
	batch:
		for {
			m, tok, err := ib.next(ctx, r.timeout(), r.Stream)
			if errors.Is(err, errNoResponders) {
				return seq, fmt.Errorf("%w: stream %s (no responders to %s); does it exist, with allow_direct?", ErrNoDirect, r.Stream, subject)
			}
			if err != nil {
				return seq, err
			}
			if tok != token {
				continue // an answer to an earlier request of this read
			}
			switch status := m.Header.Get("Status"); status {
			case "":
				msg, err := directMsg(m)
				if err != nil {
					return seq, fmt.Errorf("jsread: direct get from stream %s: %w", r.Stream, err)
				}
				if msg.Seq < seq {
					return seq, fmt.Errorf("jsread: direct get from stream %s answered sequence %d, asked from %d", r.Stream, msg.Seq, seq)
				}
				if msg.Seq > to {
					return seq, nil
				}
				got++
				seq = msg.Seq + 1
				if err := fn(msg); err != nil {
					return seq, err
				}
			case "204": // EOB
				pending, _ = strconv.ParseUint(m.Header.Get(hdrNumPending), 10, 64)
				break batch
			case "404":
				end = true
				break batch
			case "503":
				return seq, fmt.Errorf("%w: stream %s (no responders to %s); does it exist, with allow_direct?", ErrNoDirect, r.Stream, subject)
			default:
				return seq, fmt.Errorf("jsread: direct get from stream %s: %s %s", r.Stream, status, m.Header.Get("Description"))
			}
		}
		if got > 0 && !end && pending > 0 {
			continue
		}
		if seq > to || !r.Confirm {
			return seq, nil
		}
		// The answering replica holds nothing more: ask the leader.
		msg, err := r.msgGet(ctx, ib, getRequest{Seq: seq, NextFor: orAll(filter)})
		if err != nil || msg == nil || msg.Seq > to {
			return seq, err
		}
		seq = msg.Seq + 1
		if err := fn(msg); err != nil {
			return seq, err
		}
	}
	return seq, nil
}

func orAll(filter string) string {
	if filter == "" {
		return ">"
	}
	return filter
}

// directMsg reads a message of a direct get's answer.
func directMsg(m *nats.Msg) (*Msg, error) {
	_, msg, err := DirectMsg(m)
	return msg, err
}

// DirectMsg reads a message of a direct get's answer, and the name of the
// stream that answered (its Nats-Stream header). The server adds its
// headers after the message's own, so where a message carries a header of
// the same name (a publisher may set any header), the last value is the
// server's: that one is read, and only that one is removed from the
// message's headers.
func DirectMsg(m *nats.Msg) (stream string, msg *Msg, err error) {
	h := m.Header
	last := func(k string) string {
		v := h.Values(k)
		if len(v) == 0 {
			return ""
		}
		return v[len(v)-1]
	}
	seq, err := strconv.ParseUint(last(hdrSequence), 10, 64)
	if err != nil {
		return "", nil, fmt.Errorf("an answer without a valid %s header", hdrSequence)
	}
	subject := last(hdrSubject)
	if subject == "" {
		return "", nil, fmt.Errorf("the answer for sequence %d has no %s header", seq, hdrSubject)
	}
	ts, err := time.Parse(time.RFC3339Nano, last(hdrTimeStamp))
	if err != nil {
		return "", nil, fmt.Errorf("the answer for sequence %d has no valid %s header", seq, hdrTimeStamp)
	}
	stream = last(hdrStream)
	for _, k := range []string{hdrStream, hdrSubject, hdrSequence, hdrTimeStamp, hdrNumPending, hdrLastSequence, hdrUpToSequence} {
		switch v := h[k]; len(v) {
		case 0:
		case 1:
			delete(h, k)
		default:
			h[k] = v[:len(v)-1]
		}
	}
	if len(h) == 0 {
		h = nil
	}
	return stream, &Msg{Subject: subject, Seq: seq, Time: ts, Header: h, Data: m.Data}, nil
}

// The headers a direct get adds to each message it answers.
const (
	hdrStream       = "Nats-Stream"
	hdrSubject      = "Nats-Subject"
	hdrSequence     = "Nats-Sequence"
	hdrTimeStamp    = "Nats-Time-Stamp"
	hdrNumPending   = "Nats-Num-Pending"
	hdrLastSequence = "Nats-Last-Sequence"
	hdrUpToSequence = "Nats-UpTo-Sequence"
)

// apiError is a JetStream API error.
type apiError struct {
	Code        int                 `json:"code"`
	ErrCode     jetstream.ErrorCode `json:"err_code"`
	Description string              `json:"description"`
}

type msgGetResponse struct {
	Error   *apiError `json:"error"`
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Header  []byte    `json:"hdrs"`
		Data    []byte    `json:"data"`
		Time    time.Time `json:"time"`
	} `json:"message"`
}

// msgGetSubject is the leader-served get of r's stream.
func (r *Reader) msgGetSubject() string { return "$JS.API.STREAM.MSG.GET." + r.Stream }

// msgGet sends one STREAM.MSG.GET and waits for its answer: the message,
// or nil when there is none.
func (r *Reader) msgGet(ctx context.Context, ib *inbox, req getRequest) (*Msg, error) {
	body, _ := json.Marshal(req)
	token, err := ib.request(r.msgGetSubject(), body)
	if err != nil {
		return nil, err
	}
	for {
		m, tok, err := ib.next(ctx, r.timeout(), r.Stream)
		if err != nil {
			return nil, err
		}
		if tok == token {
			return r.parseMsgGet(m)
		}
	}
}

// parseMsgGet reads a STREAM.MSG.GET answer: the message, or nil when the
// stream has none there.
func (r *Reader) parseMsgGet(m *nats.Msg) (*Msg, error) {
	if st := m.Header.Get("Status"); st != "" {
		return nil, fmt.Errorf("jsread: get from stream %s: %s %s", r.Stream, st, m.Header.Get("Description"))
	}
	return DecodeMsgGet(r.Stream, m.Data)
}

// DecodeMsgGet reads the body of a STREAM.MSG.GET answer from stream: the
// message, or nil when the stream has none there.
func DecodeMsgGet(stream string, data []byte) (*Msg, error) {
	var resp msgGetResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("jsread: get from stream %s: the answer is not JSON: %w", stream, err)
	}
	if e := resp.Error; e != nil {
		switch e.ErrCode {
		case jetstream.JSErrCodeMessageNotFound:
			return nil, nil
		case jetstream.JSErrCodeStreamNotFound:
			return nil, fmt.Errorf("jsread: stream %s: %w", stream, jetstream.ErrStreamNotFound)
		}
		// Typed, so that callers can classify it (errors.As).
		return nil, fmt.Errorf("jsread: get from stream %s: %w", stream, &jetstream.APIError{Code: e.Code, ErrorCode: e.ErrCode, Description: e.Description})
	}
	sm := resp.Message
	if sm == nil {
		return nil, fmt.Errorf("jsread: get from stream %s: an answer with neither a message nor an error", stream)
	}
	msg := &Msg{Subject: sm.Subject, Seq: sm.Seq, Time: sm.Time, Data: sm.Data}
	if len(sm.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(sm.Header)
		if err != nil {
			return nil, fmt.Errorf("jsread: get from stream %s: the headers of sequence %d: %w", stream, sm.Seq, err)
		}
		msg.Header = h
	}
	return msg, nil
}

// readSeqs reads every sequence of [from, to] with STREAM.MSG.GET,
// Window requests in flight; sequences the stream no longer holds are
// skipped.
func (r *Reader) readSeqs(ctx context.Context, ib *inbox, from, to uint64, fn func(*Msg) error) error {
	type answer struct {
		msg *Msg
		err error
	}
	var (
		next   = from // the next sequence to ask for
		want   = from // the next sequence to deliver
		asked  = map[string]uint64{}
		ready  = map[uint64]answer{}
		window = r.window()
	)
	// Each pass delivers the answer for want, or waits for one answer
	// (at most Timeout); the loop ends past to.
	for want <= to {
		for next <= to && next-want < window {
			body, _ := json.Marshal(getRequest{Seq: next})
			token, err := ib.request(r.msgGetSubject(), body)
			if err != nil {
				return err
			}
			asked[token] = next
			next++
		}
		if a, ok := ready[want]; ok {
			delete(ready, want)
			if a.err != nil {
				return a.err
			}
			if a.msg != nil {
				if a.msg.Seq != want {
					return fmt.Errorf("jsread: get from stream %s answered sequence %d for %d", r.Stream, a.msg.Seq, want)
				}
				if err := fn(a.msg); err != nil {
					return err
				}
			}
			want++
			continue
		}
		m, tok, err := ib.next(ctx, r.timeout(), r.Stream)
		if err != nil {
			return err
		}
		seq, ok := asked[tok]
		if !ok {
			continue
		}
		delete(asked, tok)
		msg, err := r.parseMsgGet(m)
		ready[seq] = answer{msg, err}
	}
	return nil
}

// readFilters reads [from, to] on several filters with STREAM.MSG.GET:
// for each filter, the next message on it from where its last was found,
// one request in flight per filter, merged in sequence order.
func (r *Reader) readFilters(ctx context.Context, ib *inbox, from, to uint64, filters []string, fn func(*Msg) error) error {
	type cursor struct {
		filter string
		pos    uint64 // ask from here
		head   *Msg   // found, not delivered
		token  string // the request in flight
		done   bool
	}
	cs := make([]*cursor, len(filters))
	for i, f := range filters {
		cs[i] = &cursor{filter: f, pos: from}
	}
	// Each pass sends requests, delivers the lowest head when every
	// cursor has one (or is done), or waits for one answer; every cursor
	// moves forward or ends, so the loop ends past to.
	for {
		waiting := false
		for _, c := range cs {
			if c.done || c.head != nil {
				continue
			}
			waiting = true
			if c.token == "" {
				body, _ := json.Marshal(getRequest{Seq: c.pos, NextFor: c.filter})
				token, err := ib.request(r.msgGetSubject(), body)
				if err != nil {
					return err
				}
				c.token = token
			}
		}
		if !waiting {
			var low *Msg
			for _, c := range cs {
				if c.head != nil && (low == nil || c.head.Seq < low.Seq) {
					low = c.head
				}
			}
			if low == nil {
				return nil
			}
			for _, c := range cs {
				if c.head != nil && c.head.Seq == low.Seq {
					c.head, c.pos = nil, low.Seq+1
				}
			}
			if err := fn(low); err != nil {
				return err
			}
			continue
		}
		m, tok, err := ib.next(ctx, r.timeout(), r.Stream)
		if err != nil {
			return err
		}
		for _, c := range cs {
			if c.token != tok || tok == "" {
				continue
			}
			c.token = ""
			msg, err := r.parseMsgGet(m)
			switch {
			case err != nil:
				return err
			case msg == nil || msg.Seq > to:
				c.done = true
			case msg.Seq < c.pos:
				return fmt.Errorf("jsread: get from stream %s answered sequence %d, asked from %d", r.Stream, msg.Seq, c.pos)
			default:
				c.head = msg
			}
		}
	}
}

// Follow calls fn with every message of the stream from sequence from on
// that matches filter ("" for all), in order, and then with each new one
// as it is stored, until ctx ends (it returns nil) or fn or a read fails.
// Between reads it waits for a message on filter (a core NATS
// subscription, when the identity may subscribe to it) or at most poll
// (0: DefaultPoll), and then reads up to the stream's last sequence (its
// leader's, from STREAM.INFO).
func (r *Reader) Follow(ctx context.Context, from uint64, filter string, poll time.Duration, fn func(*Msg) error) error {
	var filters []string
	if filter != "" {
		filters = []string{filter}
	}
	if err := r.check(filters); err != nil {
		return err
	}
	if poll <= 0 {
		poll = DefaultPoll
	}
	wake := make(chan struct{}, 1)
	if filter != "" {
		sub, err := r.JS.Conn().Subscribe(filter, func(*nats.Msg) {
			select {
			case wake <- struct{}{}:
			default:
			}
		})
		if err == nil {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	next := max(from, 1)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		woke := false
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
			woke = true
		case <-t.C:
		}
		str, err := r.JS.Stream(ctx, r.Stream)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("jsread: stream %s: %w", r.Stream, err)
		}
		last := str.CachedInfo().State.LastSeq
		found := last >= next
		if found {
			err := r.Read(ctx, next, last, filters, func(m *Msg) error {
				next = m.Seq + 1
				return fn(m)
			})
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				return err
			}
			next = last + 1
		}
		if woke && !found {
			// The wake-up (the message as published) can come before the
			// stream has stored it: look again shortly, not a poll later.
			t.Reset(min(poll, wakeRecheck))
			continue
		}
		t.Reset(poll)
	}
}

// wakeRecheck is how soon Follow looks again after a wake-up that found
// nothing new.
const wakeRecheck = 50 * time.Millisecond

// LeaderGet reads one message of stream with STREAM.MSG.GET, which only
// the stream's leader answers: the message at seq (or, with lastBy, the
// last one on that subject), nil when there is none. Use it where an
// answer must not come from a replica behind the leader, on a stream that
// allows direct gets (nats.go's Stream.GetMsg switches to those there).
// A refusal of the server is a *jetstream.APIError; ctx bounds the wait
// (5 seconds when it has no deadline).
func LeaderGet(ctx context.Context, nc *nats.Conn, stream string, seq uint64, lastBy string) (*Msg, error) {
	body, err := json.Marshal(struct {
		Seq    uint64 `json:"seq,omitempty"`
		LastBy string `json:"last_by_subj,omitempty"`
	}{seq, lastBy})
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	m, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("jsread: get from stream %s: %w", stream, err)
	}
	return DecodeMsgGet(stream, m.Data)
}
