package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/processor/offline"
)

// Exit statuses of the commands that act on the processor and wait for its
// answer (publish --wait, resume), beside run's 0 (done), 1 (failed) and 2
// (usage).
const (
	exitRejected  = 3 // the processor rejected what was published
	exitNotHalted = 4 // resume: the session was not halted; nothing was waived
	exitNoAnswer  = 5 // published, but the processor did not answer in time
)

// exitError is a failure with an exit status of its own: run prints err
// and exits with code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Bounds of publishing one event: attempts (the same message and
// Nats-Msg-Id each time, so that a retry of an event the stream already
// holds is a duplicate), each waiting this long for the stream's ack.
const (
	publishAttempts       = 5
	publishAttemptTimeout = 5 * time.Second
)

// Bounds of waiting for the processor.
const (
	pollFirst = 20 * time.Millisecond  // the first wait between two reads of a session's state
	pollMax   = 500 * time.Millisecond // the longest
	// verdictGrace is how long a compaction request's verdict may take
	// before the session's state is read as well: a request the processor
	// had applied before (the same source and id) gets no verdict.
	verdictGrace = time.Second
)

const publishUsage = `usage: seamguard publish [flags] FILE... (- reads standard input)

Plays JSON Lines of structured CloudEvents (as seamguard check reads them) into
a running seamguard, in order, each event acknowledged by JetStream before the
next: a session.resumed on <prefix>.control.<session>, every other event on
<prefix>.events.<session>. Nats-Msg-Id is derived from the event's source and id
together (see docs/agents.md), so an event published again within the events
stream's dedupe window is not added twice, and another agent's event with the
same id is not dropped. When the stream answers that it holds the message id
already, the stored event is read back (this needs STREAM.MSG.GET on the events
stream, which the operator identity has) and compared: the same event is
reported as published before; a different one (or one that cannot be read) is an
error, and the run stops with exit status 1. The files are
checked before anything is published: bad lines stop the run, each named as
FILE:LINE with the field and what to fix (--keep-going publishes the other
lines instead). Standard input is checked line by line, as it is published.
A run stopped by a failure says how many of its events the events stream holds,
up to which FILE:LINE, and whether the line that failed may be stored too;
the same command run again within the dedupe window adds only what is missing.

With --wait, it prints each verdict on the events it published as it comes (one
line each, after the FILE:LINE it answers: compaction verdicts, spills, halts,
rejections, violations) and waits until the processor has handled every event.
--wait reads the session bucket and the verdict stream, as inspect does.

With the shipped NATS identities (deploy/nats), the agent may publish events
only and the operator session.resumed only: a file that holds both needs an
identity allowed both (or split it); a refused publish names its line.

exit status:
  0  every event published (with --wait: and handled, none rejected)
  1  a bad line, or a publish that failed or was refused: the message names the
     line, and the last line stored before it
  2  usage
  3  with --wait: the processor rejected some of the events (each is printed)
  5  with --wait: published, but the processor did not answer within --timeout

flags:`

func runPublish(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("publish", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	binary := fs.Bool("binary", false, "publish in binary content mode (ce- headers, percent-encoded; data as the body) instead of structured mode")
	wait := fs.Bool("wait", false, "print the verdicts on the published events and wait until the processor has handled them all")
	timeout := new(time.Duration)
	fs.Var(durations(timeout, 30*time.Second, 100*time.Millisecond, 24*time.Hour), "timeout", "with --wait: give up when the processor has answered nothing for this long")
	keepGoing := fs.Bool("keep-going", false, "publish the good lines and skip the bad ones (each reported) instead of publishing nothing; the exit status is still 1")
	fs.Usage = func() {
		fmt.Fprintln(stderr, publishUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fmt.Errorf("%w: publish takes one or more files of events (- for standard input), e.g. seamguard publish testdata/stories/seed-story.jsonl", errUsage)
	}
	if n := slices.Index(pos, "-"); n >= 0 && slices.Index(pos[n+1:], "-") >= 0 {
		return fmt.Errorf("%w: standard input (-) can be read once", errUsage)
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout %s: use a positive duration such as 30s", errUsage, *timeout)
	}
	for _, name := range pos {
		if name == "-" {
			continue
		}
		if _, err := os.Stat(name); err != nil {
			return fmt.Errorf("cannot read %s: %w", name, err)
		}
	}
	ctx, js, cfg, err := cf.open(ctx, fs, "seamguard publish")
	if err != nil {
		return err
	}
	defer func() { rerr = cf.finish(rerr) }()

	p := &publisher{js: js, nc: cf.nc, denied: cf.denied, subj: cfg.Subjects(), binary: *binary, keepGoing: *keepGoing, stderr: stderr, sessions: map[string]bool{}}
	if *wait {
		p.w = newWaiter(js, cf.nc, cfg, stdout)
		defer p.w.stop()
		if err := p.w.begin(ctx); err != nil {
			return err
		}
	}
	if !p.keepGoing {
		if err := p.checkFiles(ctx, pos); err != nil {
			return err
		}
	}
	for _, name := range pos {
		if err := p.path(ctx, name, stdin); err != nil {
			return p.stoppedAt(err)
		}
	}
	fmt.Fprintf(stderr, "seamguard publish: %s\n", p.summary())
	var waitErr error
	if p.w != nil {
		waitErr = p.w.wait(ctx, *timeout)
		if waitErr == nil {
			fmt.Fprintf(stderr, "seamguard publish: %s\n", p.w.summary())
		}
	}
	switch {
	case len(p.skipped) > 0:
		at := p.skipped
		if len(at) > 10 {
			at = append(at[:10:10], "...")
		}
		err := fmt.Errorf("%d bad line(s) skipped, not published: %s", len(p.skipped), strings.Join(at, ", "))
		if waitErr != nil {
			err = fmt.Errorf("%w; and %v", err, waitErr) // exit status 1: lines were left out
		}
		return err
	case waitErr != nil:
		return waitErr
	case p.w != nil && p.w.rejected > 0:
		return &exitError{exitRejected, fmt.Errorf("the processor rejected %d of the events published (printed above); fix them and publish them again with new ids", p.w.rejected)}
	}
	return nil
}

// finish is close for a command whose error may already explain a refused
// permission (errPermission, with the line it concerned): that one is
// kept as it is.
func (c *clientFlags) finish(err error) error {
	if errors.Is(err, errPermission) {
		c.denied.settle(time.Second)
		c.stop()
		c.nc.Close()
		return err
	}
	return c.close(err)
}

// publisher plays files of events into a deployment.
type publisher struct {
	js        jetstream.JetStream
	nc        *nats.Conn
	denied    *denials
	subj      events.Subjects
	binary    bool
	keepGoing bool
	stderr    io.Writer
	w         *waiter // nil without --wait

	published, duplicates int
	lastStored            string // FILE:LINE of the last event the stream holds now
	unsure                string // FILE:LINE of an event whose publish got no answer
	sessions              map[string]bool
	bad                   []*badLine // found by checkFiles
	skipped               []string   // FILE:LINE of the bad lines skipped
}

func (p *publisher) summary() string {
	s := fmt.Sprintf("published %d event(s) of %d session(s)", p.published, len(p.sessions))
	if p.duplicates > 0 {
		s += fmt.Sprintf("; %d more were in the events stream already (published before, within its dedupe window): not added, not decided again", p.duplicates)
	}
	return s
}

// stoppedAt is err, which stopped the run, with what the events stream
// holds of the run by then: how many events, up to which line, and
// whether the line that failed may be stored too, so that the user knows
// where to go on from.
func (p *publisher) stoppedAt(err error) error {
	stored := p.published + p.duplicates
	var b strings.Builder
	if stored > 0 {
		fmt.Fprintf(&b, "\nbefore that, %d event(s) of this run are in the events stream, up to and including %s (%s)", stored, p.lastStored, p.summary())
	}
	if p.unsure != "" {
		if stored > 0 {
			b.WriteString("; ")
		} else {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "whether %s itself is stored is not known: its publish got no answer", p.unsure)
	}
	if b.Len() == 0 {
		return err
	}
	b.WriteString(". Run the same command again within the events stream's dedupe window: what is stored already is reported as published before, not added again")
	if stored > 0 {
		fmt.Fprintf(&b, " (or go on from the line after %s)", p.lastStored)
	}
	return fmt.Errorf("%w%s", err, b.String())
}

// badLine is a line that cannot be published as it stands.
type badLine struct {
	where string // FILE:LINE
	field string
	code  events.Code
	msg   string
}

func (e *badLine) Error() string {
	field := e.field
	if field == "" {
		field = "the line"
	}
	return termtext.Escape(fmt.Sprintf("%s: %s: %s (%s)", e.where, field, e.msg, e.code))
}

// path publishes the events of the file name, or of stdin for "-".
func (p *publisher) path(ctx context.Context, name string, stdin io.Reader) error {
	if name == "-" {
		return p.file(ctx, "stdin", stdin, false)
	}
	f, err := os.Open(name)
	if err != nil {
		return fmt.Errorf("cannot read %s: %w", name, err)
	}
	defer f.Close()
	return p.file(ctx, name, f, false)
}

// maxBadShown bounds the bad lines one error lists.
const maxBadShown = 10

// checkFiles reads the named files (not standard input, which can be read
// once) and returns an error listing their bad lines, if any: a file is
// published whole or not at all.
func (p *publisher) checkFiles(ctx context.Context, names []string) error {
	for _, name := range names {
		if name == "-" {
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("cannot read %s: %w", name, err)
		}
		err = p.file(ctx, name, f, true)
		f.Close()
		if err != nil {
			return err
		}
	}
	if len(p.bad) == 0 {
		return nil
	}
	lines := make([]string, 0, maxBadShown+1)
	for i, b := range p.bad {
		if i == maxBadShown {
			lines = append(lines, fmt.Sprintf("and %d more", len(p.bad)-maxBadShown))
			break
		}
		lines = append(lines, b.Error())
	}
	if len(lines) == 1 {
		return fmt.Errorf("%s; nothing was published (--keep-going publishes the other lines)", lines[0])
	}
	return fmt.Errorf("%d bad lines; nothing was published (--keep-going publishes the other lines):\n  %s", len(p.bad), strings.Join(lines, "\n  "))
}

// file publishes the events of one input, line by line; with dry, it only
// checks them, and records the bad lines.
func (p *publisher) file(ctx context.Context, name string, in io.Reader, dry bool) error {
	br := bufio.NewReaderSize(in, 64<<10)
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		line, tooLong, err := readBoundedLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading %s: %w", name, err)
		}
		eof := errors.Is(err, io.EOF)
		if tooLong || len(bytes.TrimSpace(line)) > 0 {
			where := termtext.Escape(fmt.Sprintf("%s:%d", name, n))
			var perr error
			switch {
			case tooLong:
				perr = &badLine{where: where, code: events.CodeMalformed, msg: fmt.Sprintf("longer than %d bytes; split the event or shorten it", offline.MaxLine)}
			case dry:
				_, _, perr = p.prepare(where, bytes.TrimSpace(line))
			default:
				perr = p.event(ctx, where, bytes.TrimSpace(line))
			}
			var bad *badLine
			switch {
			case perr == nil:
			case errors.As(perr, &bad) && dry:
				p.bad = append(p.bad, bad)
			case errors.As(perr, &bad) && p.keepGoing:
				fmt.Fprintf(p.stderr, "seamguard publish: skipped %v\n", perr)
				p.skipped = append(p.skipped, where)
			case errors.As(perr, &bad):
				return fmt.Errorf("%w; nothing from this line on was published (--keep-going skips bad lines)", perr)
			default:
				return perr
			}
		}
		if eof {
			return nil
		}
	}
}

// readBoundedLine returns the next line without its newline. A line longer
// than offline.MaxLine (check's bound) is consumed whole and reported by
// tooLong, without its bytes.
func readBoundedLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > offline.MaxLine+1 {
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(buf, "\r\n"), tooLong, err
	}
}

// prepare checks one line and returns its event and message; a *badLine
// says what is wrong with it.
func (p *publisher) prepare(where string, line []byte) (*events.Event, *nats.Msg, error) {
	ev, err := events.DecodeJSON(line, events.Meta{})
	if err != nil {
		var e *events.Error
		if !errors.As(err, &e) {
			return nil, nil, &badLine{where: where, code: events.CodeMalformed, msg: err.Error()}
		}
		return nil, nil, &badLine{where: where, field: e.Field, code: e.Code, msg: e.Message}
	}
	if strings.ContainsFunc(ev.ID, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, nil, &badLine{where: where, field: "id", code: events.CodeMalformed, msg: "the id holds a control character, which no NATS header (Nats-Msg-Id) can carry; use printable characters"}
	}
	m, err := p.message(ev, line)
	if err != nil {
		return nil, nil, &badLine{where: where, code: events.CodeMalformed, msg: err.Error()}
	}
	if max := p.nc.MaxPayload(); max > 0 && int64(len(m.Data)+headerSize(m.Header)) > max {
		return nil, nil, &badLine{where: where, code: events.CodeTooLarge,
			msg: fmt.Sprintf("the event takes %d bytes, more than the server's max_payload of %d; shorten its content (a turn's content may be a reference to the full text)", len(m.Data)+headerSize(m.Header), max)}
	}
	return ev, m, nil
}

// event checks one line and publishes it.
func (p *publisher) event(ctx context.Context, where string, line []byte) error {
	ev, m, err := p.prepare(where, line)
	if err != nil {
		return err
	}
	if p.w != nil {
		if err := p.w.watch(ctx, ev.Subject); err != nil {
			return err
		}
	}
	msgID := events.MsgID(ev.Source, ev.ID)
	ack, err := p.send(ctx, m, msgID)
	if err != nil {
		// A refused permission is the server's answer to this line; say
		// which line, and what was refused.
		refused := func(v denial) bool { return v.verb == "publish" && v.subject == m.Subject }
		if len(p.denied.recorded(refused)) > 0 {
			return fmt.Errorf("%s: publishing %s %s on %s was refused: %w", where, termtext.Escape(shortType(ev.Type)), termtext.Escape(ev.ID), m.Subject, p.denied.explain(err, refused))
		}
		if !surelyNotStored(err) {
			p.unsure = where
		}
		return fmt.Errorf("%s: publishing %s %s on %s: %w", where, termtext.Escape(shortType(ev.Type)), termtext.Escape(ev.ID), m.Subject, err)
	}
	if ack.Duplicate {
		if err := storedBefore(ctx, p.nc, p.denied, p.subj, ev, msgID, ack); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	p.sessions[ev.Subject] = true
	p.lastStored = where
	if ack.Duplicate {
		p.duplicates++
	} else {
		p.published++
	}
	if p.w != nil {
		p.w.sent(where, ev, ack)
		p.w.drain()
	}
	return nil
}

// surelyNotStored reports whether err, a publish's, says that the stream
// did not store the message: the server refused it, or it was never sent.
// Otherwise (no answer in time, a connection lost) it may be stored.
func surelyNotStored(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadHeaderMsg) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrPermissionViolation)
}

func shortType(t string) string { return strings.TrimPrefix(t, events.TypePrefix) }

func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// message is the NATS message of ev, read from line: a session.resumed on
// the session's control subject, anything else on its events subject; in
// structured mode the line itself, in binary mode its data as the body and
// every other attribute as a ce- header, percent-encoded as the
// CloudEvents NATS binding asks.
func (p *publisher) message(ev *events.Event, line []byte) (*nats.Msg, error) {
	subject := p.subj.Events(ev.Subject)
	if _, ok := ev.Body.(*events.SessionResumed); ok {
		subject = p.subj.Control(ev.Subject)
	}
	m := nats.NewMsg(subject)
	if !p.binary {
		m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
		m.Data = slices.Clone(line)
		return m, nil
	}
	var attrs map[string]json.RawMessage
	if err := json.Unmarshal(line, &attrs); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(attrs))
	for name := range attrs {
		names = append(names, name)
	}
	slices.Sort(names)
	ct := events.ContentTypeJSON
	for _, name := range names {
		raw := attrs[name]
		var s string
		if json.Unmarshal(raw, &s) != nil {
			s = string(raw) // a number or a boolean extension: its JSON text
		}
		switch name {
		case "data":
			m.Data = slices.Clone(raw)
		case "datacontenttype":
			ct = s
		default:
			m.Header.Set("ce-"+name, events.PercentEncode(s))
		}
	}
	m.Header.Set("Content-Type", ct)
	return m, nil
}

// send publishes m with Nats-Msg-Id msgID (events.MsgID of its source and
// id), retrying what a retry can cure (no answer, no responders) a bounded
// number of times, each time the same message with the same id.
func (p *publisher) send(ctx context.Context, m *nats.Msg, msgID string) (*jetstream.PubAck, error) {
	return publishRetrying(ctx, p.js, m, msgID)
}

func publishRetrying(ctx context.Context, js jetstream.JetStream, m *nats.Msg, msgID string) (*jetstream.PubAck, error) {
	wait := 250 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, publishAttemptTimeout)
		ack, err := js.PublishMsg(actx, m, jetstream.WithMsgID(msgID))
		cancel()
		if err == nil {
			return ack, nil
		}
		var api *jetstream.APIError
		switch {
		case ctx.Err() != nil:
			return nil, err
		case errors.As(err, &api), errors.Is(err, nats.ErrMaxPayload), errors.Is(err, nats.ErrBadHeaderMsg), errors.Is(err, nats.ErrConnectionClosed):
			return nil, err // the server said no, or cannot be asked: a retry gets the same
		case attempt == publishAttempts:
			if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
				return nil, fmt.Errorf("no stream takes %s after %d attempts: is seamguard serve running, with this --prefix? (it creates the events stream): %w", m.Subject, attempt, err)
			}
			return nil, fmt.Errorf("no acknowledgement after %d attempts: %w", attempt, err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// storedBefore checks a duplicate ack: the stream stored nothing, because it
// holds a message under msgID already, at ack.Sequence. It reads that
// message and returns nil only when it is ev itself (the same source, id,
// type, session, time and data): a re-publish. Another event under the
// same message id, or one that cannot be read to compare, is an error
// naming both, for nothing of ev was stored.
func storedBefore(ctx context.Context, nc *nats.Conn, denied *denials, subj events.Subjects, ev *events.Event, msgID string, ack *jetstream.PubAck) error {
	this := fmt.Sprintf("%s %s of source %s (session %s)", termtext.Escape(shortType(ev.Type)), termtext.Escape(ev.ID), termtext.Escape(ev.Source), ev.Subject)
	js, err := nc.JetStream()
	if err != nil {
		return err
	}
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := js.GetMsg(ack.Stream, ack.Sequence, nats.Context(gctx))
	if err != nil {
		api := "$JS.API.STREAM.MSG.GET." + ack.Stream
		if got := denied.recorded(func(v denial) bool { return v.verb == "publish" && v.subject == api }); len(got) > 0 {
			err = denied.explain(err, func(v denial) bool { return v.verb == "publish" && v.subject == api })
		}
		return fmt.Errorf("%s was not stored: stream %s holds a message under its message id %s already (sequence %d), which could not be read to tell whether it is this event: %w; publish with an identity that may read the events stream (the operator's) to compare",
			this, ack.Stream, msgID, ack.Sequence, err)
	}
	stored, err := events.DecodeMsg(raw.Subject, raw.Header, raw.Data, subj)
	if err != nil {
		return fmt.Errorf("%s was not stored: stream %s holds another message under its message id %s (sequence %d, on %s, not a readable event: %v)",
			this, ack.Stream, msgID, ack.Sequence, raw.Subject, err)
	}
	if diff := events.Diff(stored, ev); diff != "" {
		return fmt.Errorf("%s was not stored: stream %s holds another event under its message id %s: %s %s of source %s (session %s, sequence %d), which differs in %s",
			this, ack.Stream, msgID, termtext.Escape(shortType(stored.Type)), termtext.Escape(stored.ID), termtext.Escape(stored.Source), termtext.Escape(stored.Subject), ack.Sequence, diff)
	}
	return nil
}

// A waiter follows what the processor makes of the events a command
// publishes: the verdicts on them (by causationid), and, for the events no
// verdict answers, the session's state in the bucket, whose last applied
// stream sequence says the processor has handled them. Its methods are
// called from one goroutine.
type waiter struct {
	js  jetstream.JetStream
	nc  *nats.Conn
	cfg processor.Config
	out io.Writer // each verdict, one line; nil: print nothing

	ch       chan *nats.Msg
	subs     map[string]*nats.Subscription
	kv       jetstream.KeyValue
	from     uint64 // the verdict stream's last sequence before the first publish
	byID     map[string]*sentEvent
	sessions map[string]*sessionWait
	seen     map[string]bool // verdict ids handled
	finished time.Time       // when the last event was published

	allowed, refused, spilled, halted, rejected, violations, verdictless int
}

// waitKey is the key of byID: a verdict names its session and the id of
// the event it answers (two sources may use the same id).
func waitKey(session, id string) string { return session + "\x00" + id }

// sentEvent is an event this command published, not as a duplicate.
type sentEvent struct {
	where     string // FILE:LINE
	typ       string
	session   string
	requestID string
	seq       uint64
	request   bool // a compaction request: a verdict answers it
	answered  bool
	rejection *events.EventRejected // when it was rejected
}

// sessionWait is what is awaited of one session.
type sessionWait struct {
	last     *sentEvent   // the last event published to it
	requests []*sentEvent // its compaction requests, in order
	state    processor.State
	found    bool // the bucket holds a state for it
	done     bool
}

func newWaiter(js jetstream.JetStream, nc *nats.Conn, cfg processor.Config, out io.Writer) *waiter {
	return &waiter{js: js, nc: nc, cfg: cfg, out: out, ch: make(chan *nats.Msg, 8192),
		subs: map[string]*nats.Subscription{}, byID: map[string]*sentEvent{}, sessions: map[string]*sessionWait{}, seen: map[string]bool{}}
}

func (w *waiter) stop() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
}

// begin opens the session bucket and notes where the verdict stream ends,
// before anything is published.
func (w *waiter) begin(ctx context.Context) error {
	names := w.cfg.Names()
	kv, err := w.js.KeyValue(ctx, names.Sessions)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("there is no session bucket %s, so seamguard has never served here with --prefix %s: start seamguard serve first; nothing was published", names.Sessions, w.cfg.Prefix)
	}
	if err != nil {
		return fmt.Errorf("opening the session bucket %s: %w", names.Sessions, err)
	}
	w.kv = kv
	str, err := w.js.Stream(ctx, names.Verdicts)
	if err != nil {
		return fmt.Errorf("opening the verdict stream %s: %w", names.Verdicts, err)
	}
	info, err := str.Info(ctx)
	if err != nil {
		return fmt.Errorf("opening the verdict stream %s: %w", names.Verdicts, err)
	}
	w.from = info.State.LastSeq
	return nil
}

// watch subscribes to the verdicts of session, once, before its first
// event is published.
func (w *waiter) watch(ctx context.Context, session string) error {
	if w.subs[session] != nil {
		return nil
	}
	sub, err := w.nc.ChanSubscribe(w.cfg.Subjects().Verdict(session, "*"), w.ch)
	if err != nil {
		return fmt.Errorf("subscribing to the verdicts of session %s: %w", session, err)
	}
	w.subs[session] = sub
	if err := w.flush(ctx); err != nil {
		return fmt.Errorf("subscribing to the verdicts of session %s: %w", session, err)
	}
	return nil
}

// flush waits for the server to have handled everything sent so far (a
// subscription is in place once flushed).
func (w *waiter) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return w.nc.FlushWithContext(ctx)
}

// sent records an event published; a duplicate is not decided again, so
// nothing is awaited of it.
func (w *waiter) sent(where string, ev *events.Event, ack *jetstream.PubAck) {
	req, isReq := ev.Body.(*events.CompactionRequested)
	if ack.Duplicate {
		if isReq && w.out != nil {
			fmt.Fprintf(w.out, "%s %s duplicate: %s was published before (the events stream holds it): not decided again; seamguard watch --all --session %s shows its verdict\n",
				where, ev.Subject, termtext.Escape(req.RequestID), ev.Subject)
		}
		return
	}
	se := &sentEvent{where: where, typ: shortType(ev.Type), session: ev.Subject, seq: ack.Sequence, request: isReq}
	if isReq {
		se.requestID = req.RequestID
	}
	w.byID[waitKey(ev.Subject, ev.ID)] = se
	s := w.sessions[ev.Subject]
	if s == nil {
		s = &sessionWait{}
		w.sessions[ev.Subject] = s
	}
	s.last, s.done = se, false
	if isReq {
		s.requests = append(s.requests, se)
	}
	w.finished = time.Now()
}

// drain handles the verdicts that have arrived, without waiting.
func (w *waiter) drain() bool {
	progress := false
	for {
		select {
		case m := <-w.ch:
			progress = w.handle(m.Data) || progress
		default:
			return progress
		}
	}
}

// handle takes one verdict: one on an event published here is printed and
// answers it. It reports whether it was such a verdict, not seen before.
func (w *waiter) handle(body []byte) bool {
	v, err := events.DecodeVerdict(body)
	if err != nil || w.seen[v.ID] {
		return false
	}
	se := w.byID[waitKey(v.Session, v.Cause.ID)]
	if se == nil {
		return false // on another publisher's event
	}
	w.seen[v.ID] = true
	if w.out != nil {
		shown := *v
		shown.Time = time.Time{}
		fmt.Fprintf(w.out, "%s %s\n", se.where, termtext.Escape(describeVerdict(&shown)))
	}
	switch d := v.Data.(type) {
	case *events.CompactionAllowed:
		w.allowed++
		se.answered = true
	case *events.CompactionRefused:
		w.refused++
		se.answered = true
	case *events.SessionHalted:
		w.halted++
		se.answered = se.answered || se.request
	case *events.SpillHandle:
		w.spilled++
	case *events.EventRejected:
		w.rejected++
		se.answered, se.rejection = true, d
	case *events.CompactionViolation:
		w.violations++
	}
	return true
}

// summary says what the processor made of the events.
func (w *waiter) summary() string {
	if len(w.byID) == 0 {
		return "nothing new for the processor to decide"
	}
	s := fmt.Sprintf("the processor handled them all: %d allowed, %d refused, %d spilled, %d halted, %d rejected, %d violation(s)",
		w.allowed, w.refused, w.spilled, w.halted, w.rejected, w.violations)
	if w.verdictless > 0 {
		s += fmt.Sprintf("; %d request(s) got no verdict: the processor had applied an event with the same source and id before", w.verdictless)
	}
	return s
}

// wait waits until the processor has handled every event recorded, or
// has answered nothing for timeout.
func (w *waiter) wait(ctx context.Context, timeout time.Duration) error {
	progressed := time.Now()
	poll := pollFirst
	for {
		if w.drain() {
			progressed = time.Now()
		}
		moved, err := w.settle(ctx)
		if err != nil {
			return err
		}
		if moved {
			progressed, poll = time.Now(), pollFirst
		}
		if w.allDone() {
			return nil
		}
		if time.Since(progressed) >= timeout {
			return &exitError{exitNoAnswer, w.unanswered(timeout)}
		}
		t := time.NewTimer(min(poll, time.Until(progressed.Add(timeout))))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for the processor: %w", ctx.Err())
		case m := <-w.ch:
			t.Stop()
			if w.handle(m.Data) {
				progressed = time.Now()
			}
		case <-t.C:
			poll = min(2*poll, pollMax)
		}
	}
}

func (w *waiter) allDone() bool {
	for _, s := range w.sessions {
		if !s.done {
			return false
		}
	}
	return true
}

// settle reads the state of the sessions that need it, and finishes those
// the processor has handled. It reports whether any state moved on.
func (w *waiter) settle(ctx context.Context) (bool, error) {
	moved := false
	for id, s := range w.sessions {
		if s.done {
			continue
		}
		if s.last.request && s.last.answered && !slices.ContainsFunc(s.requests, func(r *sentEvent) bool { return !r.answered }) {
			s.done = true // the verdict on its last event: all before it were handled
			continue
		}
		if s.last.request && time.Since(w.finished) < verdictGrace {
			continue // its verdict is awaited; the state is read only if it is late
		}
		st, found, err := w.state(ctx, id)
		if err != nil {
			return moved, fmt.Errorf("waiting for the processor to handle %s (session %s): %w", s.last.where, id, err)
		}
		if st.Seq > s.state.Seq {
			moved = true
		}
		s.state, s.found = st, found
		if st.Seq < s.last.seq || st.Ledger.Pending() {
			continue
		}
		// Every verdict on the session's events is in the verdict stream
		// now (they are stored before the state): read those the
		// subscription has not brought yet.
		if err := w.flush(ctx); err != nil {
			return moved, err
		}
		w.drain()
		if err := verdictsSince(ctx, w.js, w.cfg, id, w.from, func(body []byte) { w.handle(body) }); err != nil {
			return moved, fmt.Errorf("reading the verdicts of session %s: %w", id, err)
		}
		for _, r := range s.requests {
			if !r.answered {
				r.answered = true
				w.verdictless++
				if w.out != nil {
					fmt.Fprintf(w.out, "%s %s no verdict for %s: the processor had applied an event with the same source and id before (a duplicate), and did not decide it again\n",
						r.where, r.session, termtext.Escape(r.requestID))
				}
			}
		}
		s.done = true
	}
	return moved, nil
}

// unanswered says what the processor has not handled.
func (w *waiter) unanswered(timeout time.Duration) error {
	var missing []string
	for _, id := range sortedKeys(w.sessions) {
		s := w.sessions[id]
		if s.done {
			continue
		}
		for _, r := range s.requests {
			if !r.answered {
				missing = append(missing, fmt.Sprintf("%s (%s %s)", r.where, r.typ, termtext.Escape(r.requestID)))
			}
		}
		if !s.last.request {
			missing = append(missing, fmt.Sprintf("%s (%s, session %s at stream sequence %d; the processor has applied it up to %d)", s.last.where, s.last.typ, id, s.last.seq, s.state.Seq))
		}
	}
	if len(missing) > 5 {
		missing = append(missing[:5], fmt.Sprintf("and %d more", len(missing)-5))
	}
	return fmt.Errorf("everything is published, but the processor answered nothing for %s; still unanswered: %s. Is seamguard serve running, with --prefix %s? It takes the events when it runs (seamguard watch shows its verdicts)",
		timeout, strings.Join(missing, ", "), w.cfg.Prefix)
}

// state reads the state of session from the bucket; found is false when
// the bucket holds none.
func (w *waiter) state(ctx context.Context, session string) (st processor.State, found bool, err error) {
	e, err := w.kv.Get(ctx, session)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return processor.State{}, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("reading the state of session %s from bucket %s: %w", session, w.cfg.Names().Sessions, err)
	}
	st, err = processor.UnmarshalState(e.Value())
	if err != nil {
		return st, false, fmt.Errorf("the state of session %s in bucket %s: %w", session, w.cfg.Names().Sessions, err)
	}
	return st, true, nil
}

// verdictsSince calls fn with each verdict of session that the verdict
// stream stored after sequence from, in order, up to its last message now.
// It reads with get requests (package jsread), creating no consumer.
func verdictsSince(ctx context.Context, js jetstream.JetStream, cfg processor.Config, session string, from uint64, fn func([]byte)) error {
	r, info, err := jsread.Open(ctx, js, cfg.Names().Verdicts)
	if err != nil {
		return err
	}
	last := info.State.LastSeq
	if last <= from {
		return nil
	}
	return r.Read(ctx, from+1, last, []string{cfg.Subjects().Verdict(session, "*")}, func(m *jsread.Msg) error {
		fn(m.Data)
		return nil
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// lostOffsets formats a ledger range set for a report.
func lostOffsets(s ledger.RangeSet) string {
	return ledger.FormatRanges(s.Ranges())
}
