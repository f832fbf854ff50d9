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
	"os/user"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/internal/termtext"
	"github.com/seamguard/seamguard/processor"
	"github.com/seamguard/seamguard/processor/ledger"
	"github.com/seamguard/seamguard/spill"
)

const defaultURL = "nats://127.0.0.1:4222"

// clientFlags are what every client command needs: where NATS is and the
// deployment's prefix.
type clientFlags struct {
	conn   connFlags
	prefix string

	nc     *nats.Conn
	denied *denials
	stop   context.CancelFunc
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.conn.url = defaultURL
	c.conn.inbox = operatorInbox
	c.conn.register(fs, "NATS server or cluster where seamguard runs")
	fs.StringVar(&c.prefix, "prefix", "seamguard", "the deployment's subject prefix")
}

// open parses the common flags and connects. The context it returns ends
// with ctx, or as soon as the server refuses the connection a permission:
// a refused request would otherwise wait out its timeout. Once open
// succeeds, the command ends with close, which reports such a refusal.
func (c *clientFlags) open(ctx context.Context, fs *flag.FlagSet, name string) (context.Context, jetstream.JetStream, processor.Config, error) {
	cfg := processor.Config{Prefix: c.prefix}
	if err := applyEnv(fs); err != nil {
		return ctx, nil, cfg, err
	}
	cfg.Prefix = c.prefix
	if err := c.conn.validate(); err != nil {
		return ctx, nil, cfg, err
	}
	if err := cfg.Subjects().Validate(); err != nil {
		return ctx, nil, cfg, fmt.Errorf("%w: --prefix: %v", errUsage, err)
	}
	d := &denials{grants: shippedGrants(cfg), prefer: "operator", other: func(err error) { fmt.Fprintf(os.Stderr, "%s: %v\n", name, err) }}
	nc, err := c.conn.connect(name, "", d)
	if err != nil {
		return ctx, nil, cfg, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return ctx, nil, cfg, err
	}
	c.nc, c.denied = nc, d
	ctx, c.stop = d.cancelOn(ctx, nil)
	return ctx, js, cfg, nil
}

// close ends a command that open connected, and returns its error: err,
// or the permissions the server refused, if it did (see denials.explain).
// It waits for the server to answer everything sent first, so that no
// refusal goes unreported.
func (c *clientFlags) close(err error) error {
	c.denied.settle(time.Second)
	err = c.denied.explain(err, nil)
	c.stop()
	c.nc.Close()
	return err
}

func runSpill(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("spill get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	out := fs.String("o", "", "write the transcript to `FILE` (default: standard output); an existing FILE is left as it is if it holds exactly this transcript, and needs --force otherwise")
	force := fs.Bool("force", false, "with -o: replace FILE if it exists, atomically (a symbolic link is replaced, not followed)")
	only := fs.Bool("only", false, "read the spill NAME alone: only the events after its previous spill")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard spill get NAME [--only] [-o FILE [--force]]")
		fmt.Fprintln(stderr, "\nReads a spill (NAME as in its handle, e.g. my-session/3.jsonl) and verifies its digest.")
		fmt.Fprintln(stderr, "A spill holds only the events after the session's previous spill, so by default the")
		fmt.Fprintln(stderr, "whole chain is read, oldest spill first, each verified: the session's accepted events")
		fmt.Fprintln(stderr, "from its first to NAME's last_seq, one JSON line each. --only reads NAME alone.")
		fmt.Fprintln(stderr, "With -o the transcript goes to a new file, written whole or not at all; a file that")
		fmt.Fprintln(stderr, "holds exactly this transcript already is left as it is, so the command can be run again.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	switch {
	case len(args) > 0 && args[0] == "get":
		args = args[1:]
	case len(args) > 0 && isHelpFlag(args[0]):
	default:
		what := ""
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			what = fmt.Sprintf(" (spill has no subcommand %q%s)", args[0], didYouMean(suggest(args[0], []string{"get"}), func(s string) string { return "spill " + s }))
		}
		return fmt.Errorf("%w: use: seamguard spill get NAME [--only] [-o FILE [--force]]%s", errUsage, what)
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: spill get takes one spill name, such as my-session/1.jsonl", errUsage)
	}
	name := pos[0]
	toFile := *out != "" && *out != "-"
	if toFile {
		if err := checkOutput(*out, *force); err != nil {
			return err
		}
	}
	ctx, js, cfg, err := cf.open(ctx, fs, "seamguard spill get")
	if err != nil {
		return err
	}
	defer func() { rerr = cf.close(rerr) }()
	store := &spill.Store{JS: js, Stream: cfg.Names().Events, Subjects: cfg.Subjects(), Bucket: cfg.Names().Spills}

	var w io.Writer = stdout
	var tmp *os.File
	if toFile {
		tmp, err = os.CreateTemp(filepath.Dir(*out), ".spill-*")
		if err != nil {
			return fmt.Errorf("cannot write -o %s: %w", *out, err)
		}
		defer os.Remove(tmp.Name())
		defer tmp.Close()
		w = tmp
	}
	var report string
	if *only {
		var info *jetstream.ObjectInfo
		if info, err = store.Get(ctx, name, w); err == nil {
			report = fmt.Sprintf("verified %s: %d bytes, digest %s", name, info.Size, info.Digest)
		}
	} else {
		var chain []events.SpillHandle
		if chain, err = store.GetChain(ctx, name, w); err == nil {
			var size, n uint64
			for _, h := range chain {
				size += h.Size
				n += h.Events
			}
			report = fmt.Sprintf("verified %s and its chain: %d spill(s), %d events, %d bytes, from %s", name, len(chain), n, size, chain[0].Name)
		}
	}
	if err != nil {
		if errors.Is(err, jetstream.ErrObjectNotFound) && !errors.Is(err, spill.ErrChain) {
			return fmt.Errorf("no spill %q in bucket %s; names look like <session>/<n>.jsonl, as in the transcript.spilled verdict", name, cfg.Names().Spills)
		}
		if errors.Is(err, spill.ErrChain) {
			return fmt.Errorf("%w; --only reads %s alone", err, name)
		}
		return err
	}
	if tmp != nil {
		if err := tmp.Close(); err != nil {
			return fmt.Errorf("cannot write -o %s: %w", *out, err)
		}
		kept, err := placeOutput(tmp.Name(), *out, *force)
		if err != nil {
			return err
		}
		if kept {
			report += fmt.Sprintf("; %s holds exactly this transcript already: left as it is", *out)
		}
	}
	fmt.Fprintln(stderr, termtext.Escape(report))
	return nil
}

// isHelpFlag reports whether arg asks for help.
func isHelpFlag(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

// checkOutput is the usage error, before the spill is read, for an output
// name that is a directory (never replaced), or, unless force, that is
// anything but a regular file: a symbolic link, dangling or not, or any
// other kind of file. A regular file that exists is compared with the
// transcript once it is read (placeOutput).
func checkOutput(name string, force bool) error {
	st, err := os.Lstat(name)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("cannot write -o %s: %w", name, err)
	case st.IsDir():
		return fmt.Errorf("%w: -o %s is a directory; name a file in it", errUsage, name)
	case !force && !st.Mode().IsRegular():
		what := "a file that is not a regular file"
		if st.Mode()&os.ModeSymlink != 0 {
			what = "the symbolic link"
		}
		return fmt.Errorf("%w: -o %s: %s exists; give --force to replace it (or -o another name)", errUsage, name, what)
	}
	return nil
}

// placeOutput moves the finished temporary file tmp (in name's directory)
// to name. With force it replaces whatever name is, in one rename: a
// symbolic link itself, not what it points to. Without it, a hard link
// puts it there only if name does not exist; a regular file there that
// holds exactly the bytes of tmp is left as it is (kept: the same
// transcript, got again), and anything else is not replaced.
func placeOutput(tmp, name string, force bool) (kept bool, err error) {
	if force {
		if err := os.Rename(tmp, name); err != nil {
			return false, fmt.Errorf("cannot write -o %s: %w", name, err)
		}
		return false, nil
	}
	err = os.Link(tmp, name)
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, os.ErrExist):
		return keepSame(tmp, name)
	}
	// A file system without hard links: check, then rename.
	if _, err := os.Lstat(name); err == nil || !errors.Is(err, os.ErrNotExist) {
		return keepSame(tmp, name)
	}
	if err := os.Rename(tmp, name); err != nil {
		return false, fmt.Errorf("cannot write -o %s: %w", name, err)
	}
	return false, nil
}

// keepSame reports whether name, which exists, is a regular file that holds
// exactly the bytes of tmp; if it is not, the error is the usage error
// that says so.
func keepSame(tmp, name string) (bool, error) {
	if err := checkOutput(name, false); err != nil {
		return false, err
	}
	same, err := sameBytes(tmp, name)
	if err != nil {
		return false, fmt.Errorf("cannot compare -o %s with the transcript: %w; give --force to replace it (or -o another name)", name, err)
	}
	if !same {
		return false, fmt.Errorf("%w: -o %s: the file exists and holds something other than this transcript; give --force to replace it (or -o another name)", errUsage, name)
	}
	return true, nil
}

// sameBytes reports whether the files a and b hold the same bytes.
func sameBytes(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	sa, err := fa.Stat()
	if err != nil {
		return false, err
	}
	sb, err := fb.Stat()
	if err != nil {
		return false, err
	}
	if !sb.Mode().IsRegular() || sa.Size() != sb.Size() {
		return false, nil
	}
	ra, rb := bufio.NewReaderSize(fa, 64<<10), bufio.NewReaderSize(fb, 64<<10)
	bufA, bufB := make([]byte, 32<<10), make([]byte, 32<<10)
	for {
		na, errA := io.ReadFull(ra, bufA)
		nb, errB := io.ReadFull(rb, bufB)
		if !bytes.Equal(bufA[:na], bufB[:nb]) {
			return false, nil
		}
		endA := errors.Is(errA, io.EOF) || errors.Is(errA, io.ErrUnexpectedEOF)
		endB := errors.Is(errB, io.EOF) || errors.Is(errB, io.ErrUnexpectedEOF)
		switch {
		case errA != nil && !endA:
			return false, errA
		case errB != nil && !endB:
			return false, errB
		case endA || endB:
			return endA && endB, nil
		}
	}
}

func runWatch(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("watch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	session := fs.String("session", "", "only this session's verdicts")
	kind := fs.String("kind", "", "only verdicts of this kind: allowed, refused, spilled, halted, rejected or violation")
	all := fs.Bool("all", false, "start from the first verdict in the stream, not from now")
	asJSON := fs.Bool("json", false, "print each verdict as its CloudEvent JSON")
	var trust trustFlags
	trust.register(fs)
	var limit int
	fs.Var(ints(&limit, 0, 1, 1_000_000_000).orZero(meansNoLimit), "max", "stop after this many verdicts")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: seamguard watch [--session S] [--kind K] [--all] [--json] [--trust-key KEY]...")
		fmt.Fprintln(stderr, "\nFollows verdicts as they are decided, one readable line each. Each verdict's signature")
		fmt.Fprintln(stderr, "is verified: one that fails (unsigned, signed by a key not trusted, changed, or on")
		fmt.Fprintln(stderr, "another session's subject) is printed as UNATTRIBUTED with the reason (with --json:")
		fmt.Fprintln(stderr, "on standard error, not standard output), and watch then exits 1 when it ends.")
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: watch takes no arguments; use --session and --kind", errUsage)
	}
	if err := checkSession("--session", *session); err != nil {
		return err
	}
	switch *kind {
	case "", events.KindAllowed, events.KindRefused, events.KindSpilled, events.KindHalted, events.KindRejected, events.KindViolation:
	default:
		return fmt.Errorf("%w: --kind %q: use allowed, refused, spilled, halted, rejected or violation", errUsage, *kind)
	}
	ctx, js, cfg, err := cf.open(ctx, fs, "seamguard watch")
	if err != nil {
		return err
	}
	defer func() { rerr = cf.close(rerr) }()
	ver, err := trust.verifier(cfg.Subjects(), stderr, "seamguard watch")
	if err != nil {
		return err
	}
	s, k := *session, *kind
	if s == "" {
		s = "*"
	}
	if k == "" {
		k = "*"
	}
	filter := cfg.Prefix + ".verdicts." + s + "." + k
	// No consumer: the stream is read with get requests from the first
	// verdict (--all) or the next one, and read on as verdicts arrive.
	r, info, err := jsread.Open(ctx, js, cfg.Names().Verdicts)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("cannot follow stream %s: %w; is seamguard serving with --prefix %s?", cfg.Names().Verdicts, err, cfg.Prefix)
	}
	if err != nil {
		return fmt.Errorf("cannot follow stream %s: %w", cfg.Names().Verdicts, err)
	}
	from := info.State.LastSeq + 1
	if *all {
		from = info.State.FirstSeq
	}
	fmt.Fprintf(stderr, "watching %s\n", filter)
	unattributed := 0
	defer func() {
		if rerr == nil && unattributed > 0 {
			rerr = fmt.Errorf("%d message(s) on verdict subjects failed verification (UNATTRIBUTED above): they were not published by a trusted seamguard processor", unattributed)
		}
	}()
	// --max counts every message shown, unattributed ones included.
	n := 0
	errEnough := errors.New("enough")
	err = r.Follow(ctx, from, filter, 0, func(m *jsread.Msg) error {
		if limit > 0 && n >= limit {
			return errEnough
		}
		n++
		if _, err := ver.Verify(m.Subject, m.Header, m.Data); err != nil {
			unattributed++
			line := termtext.Escape(describeFailure(m.Subject, err))
			if *asJSON {
				fmt.Fprintln(stderr, line)
			} else {
				if v, derr := events.DecodeVerdict(m.Data); derr == nil {
					line += "\n  claims: " + describeVerdict(v)
				}
				fmt.Fprintln(stdout, line)
			}
		} else if *asJSON {
			// As recorded, but safe for a terminal (termtext.JSON): the
			// verdict stream holds what its publishers wrote.
			b, _ := termtext.JSON(m.Data)
			fmt.Fprintf(stdout, "%s\n", b)
		} else if v, err := events.DecodeVerdict(m.Data); err != nil {
			fmt.Fprintf(stdout, "%s: not a seamguard verdict: %s\n", termtext.Escape(m.Subject), termtext.Escape(err.Error()))
		} else {
			fmt.Fprintln(stdout, describeVerdict(v))
		}
		if limit > 0 && n >= limit {
			return errEnough
		}
		return nil
	})
	if errors.Is(err, errEnough) || ctx.Err() != nil {
		return nil
	}
	return err
}

// describeVerdict is one readable line about a verdict, escaped for a
// terminal (termtext): the ids, names and messages in it come from the
// wire, and a newline in one of them does not start another line.
func describeVerdict(v *events.Verdict) string {
	var b strings.Builder
	if !v.Time.IsZero() {
		b.WriteString(v.Time.UTC().Format(time.RFC3339) + " ")
	}
	session := v.Session
	if session == "" {
		session = events.InvalidSession
	}
	fmt.Fprintf(&b, "%-20s %-9s", session, v.Kind())
	switch d := v.Data.(type) {
	case *events.CompactionAllowed:
		fmt.Fprintf(&b, " %s: summary %s, tail from %d, head %d", d.RequestID, fmtRanges(d.SummaryCoverage), d.TailStart, d.Head)
		if len(d.Cured) > 0 {
			fmt.Fprintf(&b, "; cured %v", d.Cured)
			for _, h := range d.RecoveredBy {
				fmt.Fprintf(&b, " by %s", h.Name)
			}
		}
	case *events.CompactionRefused:
		fmt.Fprintf(&b, " %s:", d.RequestID)
		for _, r := range d.Reasons {
			fmt.Fprintf(&b, " %s %s", r.Code, fmtRanges(r.AtRisk))
		}
		if d.Spill != nil {
			fmt.Fprintf(&b, "; spill %s", d.Spill.Name)
		}
		fmt.Fprintf(&b, "; next %s", d.Next)
	case *events.SpillHandle:
		fmt.Fprintf(&b, " %s: %s, %d events, %d bytes, %s", d.Name, fmtRanges([]events.Range{d.Range}), d.Events, d.Size, d.Digest)
		if d.Previous != nil {
			fmt.Fprintf(&b, ", after %s", *d.Previous)
		}
	case *events.SessionHalted:
		fmt.Fprintf(&b, " %s: unrecoverable %s", d.RequestID, fmtRanges(d.Unrecoverable))
	case *events.EventRejected:
		fmt.Fprintf(&b, " %s %s (seq %d): %s", d.Code, d.Field, d.Input.Seq, d.Message)
	case *events.CompactionViolation:
		fmt.Fprintf(&b, " %s: %s", d.RequestID, d.Message)
	}
	return termtext.Escape(b.String())
}

const resumeUsage = `usage: seamguard resume SESSION --note TEXT [--timeout D]

Lifts a halt: publishes session.resumed on the session's control subject, then
waits for the processor to take it and reports what really happened. The
offsets the halt named become waived (recorded as lost, counted as recoverable
from then on), and the session's compactions are decided again.

It also takes a parked session out of its park (one stuck past serve's
--park-after on a failure retrying cannot fix): every input that waited in the
events stream is applied, in order, before the resume. A parked session is
resumed whatever its state.

Before it publishes, it reads the session's state (bucket <prefix>-sessions)
once the processor has applied every input of the session the events stream
holds (waiting up to --timeout): a session that is unknown, closed or not
halted, and not parked, gets nothing published, and the exit status says why.
It reads the state again until the processor has applied the resume; a
rejection comes as a verdict on <prefix>.verdicts.<session>.rejected. The
shipped operator identity may do all of it.

exit status:
  0  the halt is lifted (the waived offsets are printed), or the session is out
     of its park
  1  failed: nothing was published, or its outcome is unknown (the message says)
  2  usage
  3  the session is unknown or closed: nothing was published (or, if that
     changed meanwhile, the processor rejected the resume: unknown_session,
     session_closed, ...)
  4  the session is neither halted nor parked: nothing to waive, nothing was
     published
  5  the processor did not answer within --timeout: either it has not applied
     the session's inputs yet, so nothing was published, or the resume is
     published and not taken yet (it will be when the processor runs); the
     message says which

flags:`

func runResume(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) (rerr error) {
	fs := flag.NewFlagSet("resume", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	note := fs.String("note", "", "why the unrecoverable offsets are accepted as lost (required; kept in the audit log)")
	source := fs.String("source", "", "CloudEvents source of the resume (default urn:seamguard:operator:<user>@<host>)")
	timeout := new(time.Duration)
	fs.Var(durations(timeout, 30*time.Second, 100*time.Millisecond, 24*time.Hour), "timeout", "how long to wait for the processor: to have applied the session's inputs before the resume is published, and to take the resume after")
	fs.Usage = func() {
		fmt.Fprintln(stderr, resumeUsage)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: resume takes one session id", errUsage)
	}
	session := pos[0]
	if err := checkSession("", session); err != nil {
		return err
	}
	if strings.TrimSpace(*note) == "" {
		return fmt.Errorf("%w: --note is required: say why the lost offsets are accepted (it is kept in the events stream)", errUsage)
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: --timeout %s: use a positive duration such as 30s", errUsage, *timeout)
	}
	ctx, js, cfg, err := cf.open(ctx, fs, "seamguard resume")
	if err != nil {
		return err
	}
	defer func() { rerr = cf.finish(rerr) }()
	src := *source
	if src == "" {
		who := "operator"
		if u, err := user.Current(); err == nil {
			who = u.Username
		}
		host, _ := os.Hostname()
		src = "urn:seamguard:operator:" + who + "@" + host
	}
	id := "resume-" + nuid.Next()
	body, err := json.Marshal(map[string]any{
		"specversion": "1.0", "id": id, "source": src, "type": events.TypeSessionResumed,
		"subject": session, "time": time.Now().UTC().Format(time.RFC3339Nano),
		"datacontenttype": events.ContentTypeJSON, "data": map[string]string{"note": *note},
	})
	if err != nil {
		return err
	}
	ev, err := events.DecodeJSON(body, events.Meta{})
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err) // a --note or --source over its bound
	}

	w := newWaiter(js, cf.nc, cfg, nil)
	defer w.stop()
	if err := w.begin(ctx); err != nil {
		return err
	}
	// Whether it is parked: the resume then takes it out of its park,
	// whatever its state.
	parked, err := parkRecord(ctx, w, session)
	if err != nil {
		return err
	}
	// What the session is before: halted, and on which offsets. Nothing is
	// published to a session with no halt to lift.
	before, err := resumable(ctx, w, js, cfg, session, parked != nil, *timeout)
	if err != nil {
		return err
	}
	if err := w.watch(ctx, session); err != nil {
		return err
	}

	// The control subject: only there does a resume count (deployments
	// grant it to operators alone).
	m := nats.NewMsg(cfg.Subjects().Control(session))
	m.Header.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	m.Data = body
	ack, err := publishRetrying(ctx, js, m, events.MsgID(src, id))
	if err != nil {
		return fmt.Errorf("publishing the resume: %w", err)
	}
	fmt.Fprintf(stdout, "published session.resumed %s for session %s (stream %s, sequence %d); waiting for the processor\n", id, session, ack.Stream, ack.Sequence)
	if ack.Duplicate {
		return fmt.Errorf("the events stream took the resume %s as a duplicate of one it holds, so the processor will not see it again: run resume again", id)
	}
	w.sent("resume", ev, ack)
	if err := w.wait(ctx, *timeout); err != nil {
		var ee *exitError
		if errors.As(err, &ee) && ee.code == exitNoAnswer {
			return &exitError{exitNoAnswer, fmt.Errorf("the resume is published (stream %s, sequence %d), but the processor did not take it within %s: is seamguard serve running, with --prefix %s? It takes the resume when it runs; seamguard inspect %s then shows whether the halt is lifted",
				ack.Stream, ack.Sequence, *timeout, cfg.Prefix, session)}
		}
		return err
	}
	if r := w.byID[waitKey(session, id)].rejection; r != nil {
		hint := ""
		switch r.Code {
		case events.CodeUnknownSession:
			hint = "; the processor knows no session of that id: check it (seamguard watch --all --session ID shows a session's verdicts)"
		case events.CodeSessionClosed:
			hint = "; a closed session has no halt to lift"
		}
		return &exitError{exitRejected, fmt.Errorf("the processor rejected the resume of session %s: %s: %s%s", session, r.Code, termtext.Escape(r.Message), hint)}
	}

	after := w.sessions[session].state
	if parked != nil {
		fmt.Fprintf(stdout, "session %s out of its park (parked %s: %s): its inputs after events sequence %d are applied; its state now stands at sequence %d\n",
			session, parked.ParkedAt.Format(time.RFC3339), termtext.Escape(parked.Cause), parked.StoredSeq, after.Seq)
	}
	bv, av := before.Ledger.View(), after.Ledger.View()
	waived := ledger.Diff(av.Waived, bv.Waived)
	wasHalted := bv.Status == "halted"
	switch {
	case waived.Len() > 0 || wasHalted && av.Status != "halted":
		since := ""
		if bv.HaltRequest != "" {
			since = fmt.Sprintf(" (since compaction %q)", termtext.Escape(bv.HaltRequest))
		}
		what := "it named no offsets, so nothing is waived"
		if waived.Len() > 0 {
			what = "offsets " + lostOffsets(waived) + " are waived: recorded as lost, and counted as recoverable from now on"
		}
		fmt.Fprintf(stdout, "session %s resumed: its halt%s is lifted; %s\n", session, since, what)
		if av.Status == "halted" {
			fmt.Fprintf(stdout, "session %s is halted again since, by compaction %q: seamguard inspect %s\n", session, termtext.Escape(av.HaltRequest), session)
		}
		return nil
	case av.Status == "halted":
		return fmt.Errorf("session %s is still halted (since compaction %q) after the resume: seamguard inspect %s shows why", session, termtext.Escape(av.HaltRequest), session)
	}
	if parked != nil {
		return nil
	}
	return &exitError{exitNotHalted, fmt.Errorf("session %s was not halted: nothing to waive; the resume is recorded (sequence %d) and changed nothing", session, ack.Sequence)}
}

// parkRecord returns session's park record, or nil when it is not parked
// (a record that does not parse is not one, as for the processor).
func parkRecord(ctx context.Context, w *waiter, session string) (*processor.ParkRecord, error) {
	e, err := w.kv.Get(ctx, processor.ParkedKey(session))
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading whether session %s is parked (key %s of bucket %s): %w; nothing was published", session, processor.ParkedKey(session), w.cfg.Names().Sessions, err)
	}
	var rec processor.ParkRecord
	if json.Unmarshal(e.Value(), &rec) != nil || rec.Session != session {
		return nil, nil
	}
	return &rec, nil
}

// resumable reads session's state, as the processor has stored it once it
// has applied every input of the session the events stream holds now
// (waiting for it up to timeout), and returns it if a resume has a halt to
// lift. Otherwise nothing is to be published, and the error says why: the
// session is unknown or closed (exitRejected), it is not halted
// (exitNotHalted), or the processor has not caught up (exitNoAnswer). A
// parked session is resumable whatever its state: the resume takes it out
// of its park.
func resumable(ctx context.Context, w *waiter, js jetstream.JetStream, cfg processor.Config, session string, parked bool, timeout time.Duration) (processor.State, error) {
	if parked {
		st, _, err := w.state(ctx, session)
		return st, err
	}
	last, err := lastInput(ctx, js, cfg, session)
	if err != nil {
		return processor.State{}, err
	}
	deadline := time.Now().Add(timeout)
	poll := pollFirst
	for {
		st, found, err := w.state(ctx, session)
		if err != nil {
			return st, err
		}
		if st.Seq >= last && !st.Ledger.Pending() {
			v := st.Ledger.View()
			switch {
			case !found || v.Status == "new":
				return st, &exitError{exitRejected, fmt.Errorf("session %s is unknown: the processor has applied no session.opened of it, so it has no halt to lift; nothing was published. Check the id: seamguard watch --all --session %s shows a session's verdicts", session, session)}
			case v.Status == "closed":
				return st, &exitError{exitRejected, fmt.Errorf("session %s is closed: a closed session has no halt to lift; nothing was published", session)}
			case v.Status != "halted":
				return st, &exitError{exitNotHalted, fmt.Errorf("session %s is not halted (it is %s, applied up to events sequence %d): nothing to waive; nothing was published", session, v.Status, st.Seq)}
			}
			return st, nil
		}
		if !time.Now().Before(deadline) {
			return st, &exitError{exitNoAnswer, fmt.Errorf("nothing was published: the events stream holds inputs of session %s up to sequence %d, but the processor has applied them only up to %d and did not catch up within --timeout %s, so whether the session is halted is not known yet. Is seamguard serve running, with --prefix %s? Run resume again once it has caught up (seamguard inspect %s shows the session's state)",
				session, last, st.Seq, timeout, cfg.Prefix, session)}
		}
		t := time.NewTimer(min(poll, time.Until(deadline)))
		select {
		case <-ctx.Done():
			t.Stop()
			return st, fmt.Errorf("waiting for the processor to apply the inputs of session %s: %w; nothing was published", session, ctx.Err())
		case <-t.C:
		}
		poll = min(2*poll, pollMax)
	}
}

// lastInput returns the events stream sequence of session's last input
// (on its events or its control subject), or 0 when the stream holds none.
func lastInput(ctx context.Context, js jetstream.JetStream, cfg processor.Config, session string) (uint64, error) {
	name := cfg.Names().Events
	cfg, err := processor.ForStream(ctx, js, cfg)
	if err != nil {
		return 0, fmt.Errorf("reading the events stream %s: %w; nothing was published", name, err)
	}
	var last uint64
	for _, subject := range cfg.Subjects().SessionFilters(session) {
		// The leader's answer (the stream allows direct gets, which a
		// replica behind it may answer).
		m, err := jsread.LeaderGet(ctx, js.Conn(), name, 0, subject)
		switch {
		case err != nil:
			return 0, fmt.Errorf("reading the last input of session %s on %s from stream %s: %w; nothing was published", session, subject, name, err)
		case m != nil:
			last = max(last, m.Seq)
		}
	}
	return last, nil
}
