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
	var jsize int64

	sessions := map[string]*session{}
	var sum Summary
	out := bufio.NewWriter(r.Out)
	emit := func(outs []events.Output, s *session) error {
		for _, o := range outs {
			_, _, body, err := r.Encoder.Encode(o)
			if err != nil {
				return fmt.Errorf("offline: %w", err)
			}
			out.Write(body)
			if err := out.WriteByte('\n'); err != nil {
				return fmt.Errorf("offline: write output: %w", err)
			}
			if s != nil {
				s.count(o)
			}
		}
		return nil
	}

	br := bufio.NewReaderSize(in, 64<<10)
	var lineNo uint64
	for {
		if err := ctx.Err(); err != nil {
			return sum, err
		}
		line, tooLong, err := readLine(br)
		if err != nil && !errors.Is(err, io.EOF) {
			return sum, fmt.Errorf("offline: read input: %w", err)
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
		sum.Lines++
		meta := events.Meta{Seq: lineNo, Headers: map[string][]string{}}
		var ev *events.Event
		var derr error
		if tooLong {
			derr = events.Errorf(events.CodeMalformed, "", "line %d is longer than %d bytes; split the transcript or shorten the event", lineNo, MaxLine)
		} else {
			ev, derr = events.DecodeJSON(line, meta)
			if derr == nil {
				// The file is the operator's own: a session.resumed in it
				// counts as arriving on the control subject.
				_, ev.Meta.Control = ev.Body.(*events.SessionResumed)
			}
		}
		if derr != nil {
			var e *events.Error
			if !errors.As(derr, &e) {
				e = &events.Error{Code: events.CodeMalformed, Message: derr.Error()}
			}
			sess := sessionHint(line)
			if sess == "" {
				sum.Rejected++
			} else {
				s := sessions[sess]
				if s == nil {
					s = &session{sum: SessionSummary{Session: sess}}
					sessions[sess] = s
				}
				s.sum.Events++
				s.sum.Rejected++
			}
			cause := events.Cause{Meta: meta}
			if !tooLong {
				cause.ReadID = events.ReadableID(nil, line)
			}
			if err := emit([]events.Output{ledger.Rejection(cause, sess, e)}, nil); err != nil {
				return sum, err
			}
		} else {
			s := sessions[ev.Subject]
			if s == nil {
				s = &session{sum: SessionSummary{Session: ev.Subject}}
				sessions[ev.Subject] = s
			}
			s.sum.Events++
			res, err := ledger.Step(&s.l, ledger.Input{Event: ev}, r.Config)
			if err != nil {
				return sum, fmt.Errorf("offline: line %d: %w", lineNo, err)
			}
			switch {
			case res.Duplicate:
				s.sum.Duplicates++
			case res.Accepted:
				s.sum.Accepted++
				enc, err := events.MarshalStructured(ev)
				if err != nil {
					return sum, fmt.Errorf("offline: line %d: %w", lineNo, err)
				}
				enc = append(enc, '\n')
				if _, err := journal.Write(enc); err != nil {
					return sum, fmt.Errorf("offline: journal: %w", err)
				}
				s.lines = append(s.lines, span{off: jsize, n: int64(len(enc)), seq: lineNo})
				jsize += int64(len(enc))
			}
			if err := emit(res.Outputs, s); err != nil {
				return sum, err
			}
			if res.Spill != nil {
				result := r.spill(journal, s, res.Spill)
				res, err = ledger.Step(&s.l, ledger.Input{Spill: &result}, r.Config)
				if err != nil {
					return sum, fmt.Errorf("offline: line %d: %w", lineNo, err)
				}
				if err := emit(res.Outputs, s); err != nil {
					return sum, err
				}
			}
		}
		if eof {
			break
		}
	}
	if err := out.Flush(); err != nil {
		return sum, fmt.Errorf("offline: write output: %w", err)
	}
	for _, s := range sessions {
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
	return sum, nil
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
