package offline

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

// MaxLine is the longest input line read; a longer one is rejected as
// malformed and skipped.
const MaxLine = 16 << 20

// Runner decides a file of events. The zero value is not usable: SpillDir
// and Out must be set; Encoder and Config may stay zero.
type Runner struct {
	SpillDir string         // where spills are written, as files named like the objects
	Bucket   string         // the bucket named in handles; empty means spill.Bucket
	Config   ledger.Config  // the decision settings
	Encoder  events.Encoder // how outputs are written
	Out      io.Writer      // every output event, one JSON line each, in order
}

// Validate reports every setting that keeps the Runner from working.
func (r *Runner) Validate() error {
	var errs []error
	if r.SpillDir == "" {
		errs = append(errs, errors.New("offline: SpillDir is empty"))
	}
	if r.Out == nil {
		errs = append(errs, errors.New("offline: Out is nil"))
	}
	if err := r.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SessionSummary counts what happened to one session.
type SessionSummary struct {
	Session    string
	Events     int // lines addressed to the session, accepted or not
	Accepted   int
	Rejected   int
	Duplicates int
	Allowed    int
	Refused    int
	Spilled    int
	Halted     int
	Violations int
	Head       uint64
	State      string // open, halted, closed or new
}

// Summary is the outcome of a run.
type Summary struct {
	Lines    int              // non-blank lines read
	Rejected int              // lines rejected before any session could be named
	Sessions []SessionSummary // sorted by session id
}

type session struct {
	l     ledger.Ledger
	lines []span // accepted events in the journal, in order
	sum   SessionSummary
}

// span is where an accepted event's line is in the journal, and its line
// number (its sequence).
type span struct {
	off, n int64
	seq    uint64
}

// Run reads structured CloudEvents, one per line, decides them and writes the
// outputs. It returns an error only for I/O failures or a cancelled context;
// bad lines become event.rejected outputs. Blank lines are skipped.
func (r *Runner) Run(ctx context.Context, in io.Reader) (Summary, error) {
	if err := r.Validate(); err != nil {
		return Summary{}, err
	}
	journal, err := os.CreateTemp("", "seamguard-journal-*")
	if err != nil {
		return Summary{}, fmt.Errorf("offline: journal: %w", err)
	}
	defer os.Remove(journal.Name())
	defer journal.Close()
	x := &run{r: r, journal: journal, sessions: map[string]*session{}, out: bufio.NewWriter(r.Out)}
	br := bufio.NewReaderSize(in, 64<<10)
	var lineNo uint64
	for {
		if err := ctx.Err(); err != nil {
			return x.sum, err
		}
		line, tooLong, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return x.sum, fmt.Errorf("offline: read input: %w", err)
		}
		eof := errors.Is(err, io.EOF)
		if len(bytes.TrimSpace(line)) == 0 && !tooLong {
			if eof {
				break
			}
			lineNo++
			continue
		}
		lineNo++
		if err := x.line(lineNo, line, tooLong); err != nil {
			return x.sum, err
		}
		if eof {
			break
		}
	}
	if err := x.out.Flush(); err != nil {
		return x.sum, fmt.Errorf("offline: write output: %w", err)
	}
	return x.summary(), nil
}

// run is one Run's state: the journal of accepted events (what spills are
// copied from), the sessions, and the outputs written so far.
type run struct {
	r        *Runner
	journal  *os.File
	jsize    int64 // the journal's size
	sessions map[string]*session
	sum      Summary
	out      *bufio.Writer
}

// session returns the state of session id, new when it has none yet.
func (x *run) session(id string) *session {
	s := x.sessions[id]
	if s == nil {
		s = &session{sum: SessionSummary{Session: id}}
		x.sessions[id] = s
	}
	return s
}

// emit writes outs, counted for s when s is not nil.
func (x *run) emit(outs []events.Output, s *session) error {
	for _, o := range outs {
		_, _, body, err := x.r.Encoder.Encode(o)
		if err != nil {
			return fmt.Errorf("offline: %w", err)
		}
		x.out.Write(body)
		if err := x.out.WriteByte('\n'); err != nil {
			return fmt.Errorf("offline: write output: %w", err)
		}
		if s != nil {
			s.count(o)
		}
	}
	return nil
}

// line decodes and decides the non-blank line lineNo (too long to read
// when tooLong).
func (x *run) line(lineNo uint64, line []byte, tooLong bool) error {
	x.sum.Lines++
	meta := events.Meta{Seq: lineNo, Headers: map[string][]string{}}
	if tooLong {
		return x.reject(meta, line, true, events.Errorf(events.CodeMalformed, "", "line %d is longer than %d bytes; split the transcript or shorten the event", lineNo, MaxLine))
	}
	ev, err := events.DecodeJSON(line, meta)
	if err != nil {
		return x.reject(meta, line, false, err)
	}
	// The file is the operator's own: a session.resumed in it counts as
	// arriving on the control subject.
	_, ev.Meta.Control = ev.Body.(*events.SessionResumed)
	return x.decide(lineNo, ev)
}

// reject writes the rejection of a line that is no event, counted for the
// session it names, if it names one.
func (x *run) reject(meta events.Meta, line []byte, tooLong bool, derr error) error {
	var e *events.Error
	if !errors.As(derr, &e) {
		e = &events.Error{Code: events.CodeMalformed, Message: derr.Error()}
	}
	sess := sessionHint(line)
	if sess == "" {
		x.sum.Rejected++
	} else {
		s := x.session(sess)
		s.sum.Events++
		s.sum.Rejected++
	}
	cause := events.Cause{Meta: meta}
	if !tooLong {
		cause.ReadID = events.ReadableID(nil, line)
	}
	return x.emit([]events.Output{ledger.Rejection(cause, sess, e)}, nil)
}

// decide steps ev, line lineNo, through its session's ledger, journals it
// when accepted, writes the outputs, and makes the spill it asks for.
func (x *run) decide(lineNo uint64, ev *events.Event) error {
	s := x.session(ev.Subject)
	s.sum.Events++
	res, err := ledger.Step(&s.l, ledger.Input{Event: ev}, x.r.Config)
	if err != nil {
		return fmt.Errorf("offline: line %d: %w", lineNo, err)
	}
	switch {
	case res.Duplicate:
		s.sum.Duplicates++
	case res.Accepted:
		s.sum.Accepted++
		if err := x.journalize(s, lineNo, ev); err != nil {
			return err
		}
	}
	if err := x.emit(res.Outputs, s); err != nil {
		return err
	}
	if res.Spill == nil {
		return nil
	}
	result := x.r.spill(x.journal, s, res.Spill)
	res, err = ledger.Step(&s.l, ledger.Input{Spill: &result}, x.r.Config)
	if err != nil {
		return fmt.Errorf("offline: line %d: %w", lineNo, err)
	}
	return x.emit(res.Outputs, s)
}

// journalize appends accepted event ev, line lineNo, to the journal.
func (x *run) journalize(s *session, lineNo uint64, ev *events.Event) error {
	enc, err := events.MarshalStructured(ev)
	if err != nil {
		return fmt.Errorf("offline: line %d: %w", lineNo, err)
	}
	enc = append(enc, '\n')
	if _, err := x.journal.Write(enc); err != nil {
		return fmt.Errorf("offline: journal: %w", err)
	}
	s.lines = append(s.lines, span{off: x.jsize, n: int64(len(enc)), seq: lineNo})
	x.jsize += int64(len(enc))
	return nil
}

// summary is the run's summary, sessions in order of their ids.
func (x *run) summary() Summary {
	sum := x.sum
	for _, s := range x.sessions {
		s.sum.Head = s.l.Head()
		switch {
		case s.l.Closed():
			s.sum.State = "closed"
		case s.l.Halted():
			s.sum.State = "halted"
		case s.l.Opened():
			s.sum.State = "open"
		default:
			s.sum.State = "new"
		}
		sum.Sessions = append(sum.Sessions, s.sum)
	}
	sort.Slice(sum.Sessions, func(i, j int) bool { return sum.Sessions[i].Session < sum.Sessions[j].Session })
	return sum
}

// spill copies the session's accepted events from req.FirstSeq to
// req.LastSeq from the journal into a spill file: all of them for a
// session's first spill, those after the previous spill for the next ones.
// A failure becomes the SpillResult's Failure, which halts the session.
func (r *Runner) spill(journal *os.File, s *session, req *ledger.SpillRequest) ledger.SpillResult {
	bucket := r.Bucket
	if bucket == "" {
		bucket = spill.Bucket
	}
	from, _ := slices.BinarySearchFunc(s.lines, req.FirstSeq, func(sp span, seq uint64) int { return cmp.Compare(sp.seq, seq) })
	h, err := spill.Dir{Path: r.SpillDir}.Write(*req, bucket, func(w *spill.Writer) error {
		buf := make([]byte, 0, 4096)
		for _, sp := range s.lines[from:] {
			if sp.seq > req.LastSeq {
				break
			}
			if int64(cap(buf)) < sp.n {
				buf = make([]byte, sp.n)
			}
			buf = buf[:sp.n]
			if _, err := journal.ReadAt(buf, sp.off); err != nil {
				return fmt.Errorf("offline: journal: %w", err)
			}
			if err := w.WriteLine(buf[:sp.n-1]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return ledger.SpillResult{Failure: err.Error()}
	}
	return ledger.SpillResult{Handle: h}
}

func (s *session) count(o events.Output) {
	switch o.Kind() {
	case events.KindAllowed:
		s.sum.Allowed++
	case events.KindRefused:
		s.sum.Refused++
	case events.KindSpilled:
		s.sum.Spilled++
	case events.KindHalted:
		s.sum.Halted++
	case events.KindRejected:
		s.sum.Rejected++
	case events.KindViolation:
		s.sum.Violations++
	}
}

// readLine returns the next line without its newline. A line longer than
// MaxLine is consumed whole and reported by tooLong, without its bytes.
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > MaxLine+1 {
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

// sessionHint digs a valid session id out of a line that failed to decode,
// so that its rejection goes to that session's verdict subject; "" if none.
// The rejection's id is derived from the line number, like the runtime's
// from the stream sequence, never from an id the broken line claims.
func sessionHint(line []byte) string {
	var h struct {
		Subject any `json:"subject"`
	}
	if json.Unmarshal(line, &h) != nil {
		return ""
	}
	session, _ := h.Subject.(string)
	if !events.ValidSessionID(session) {
		return ""
	}
	return session
}
