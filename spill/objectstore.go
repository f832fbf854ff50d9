package spill

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/jsread"
	"github.com/seamguard/seamguard/processor/ledger"
)

// Defaults of Store.
const (
	DefaultRetries  = 3
	DefaultBackoff  = 200 * time.Millisecond
	DefaultMaxChain = 10_000
)

// maxBackoff caps the wait between two attempts of Write.
const maxBackoff = 30 * time.Second

// readIdle bounds how long Write waits for the next event of a transcript
// (or Get for the next chunk) before it gives up; Write first asks the
// stream whether the transcript's end is still there.
const readIdle = 10 * time.Second

// Object metadata keys Write sets, so that a handle can be rebuilt from the
// object's info alone (see HandleOf), and the next spill of the chain can
// restore the replay's state (see the package doc).
const (
	metaSession    = "seamguard-session"
	metaRangeStart = "seamguard-range-start"
	metaRangeEnd   = "seamguard-range-end"
	metaEvents     = "seamguard-events"
	metaFirstSeq   = "seamguard-first-seq"
	metaLastSeq    = "seamguard-last-seq"
	metaPrevious   = "seamguard-previous" // absent for a chain's first spill
	// The shadow ledger's state after this spill: the chunks holding its
	// snapshot, their count, size and digest, and the stream sequence the
	// replay had reached (the object's last-seq).
	metaStateNUID   = "seamguard-state-nuid"
	metaStateChunks = "seamguard-state-chunks"
	metaStateSize   = "seamguard-state-size"
	metaStateDigest = "seamguard-state-digest"
	metaStateSeq    = "seamguard-state-seq"
)

// Store writes spills into a JetStream object store, reading each transcript
// back from the events stream. The zero value is not usable: set JS, Stream
// and Bucket, and check Validate. A Store is not changed by its methods, so
// any number of goroutines may call them at once, also for the same name
// (the last put wins; each verifies what it wrote).
type Store struct {
	JS       jetstream.JetStream
	Stream   string          // events stream name, e.g. "SEAMGUARD_EVENTS"
	Subjects events.Subjects // prefix of the events subjects
	Bucket   string          // object store bucket (must exist), e.g. "seamguard-spills"
	Retries  int             // object store attempts; 0 means 3
	Backoff  time.Duration   // first retry delay, doubled each time up to 30s; 0 means 200ms
	Verify   bool            // after the put, read the object back and check its digest
	// ChunkSize is the size of the object's chunks; 0 means
	// DefaultChunkSize, or half the server's largest message if that is
	// less.
	ChunkSize int
	// Ledger is the processor's decision settings. The replay that decides
	// which events the processor accepted steps with them: a ledger's
	// limits decide acceptance.
	Ledger ledger.Config
	// MaxChain bounds how many spills a chain may have, for GetChain and
	// for Write's walk back to a session's first spill; 0 means
	// DefaultMaxChain.
	MaxChain int
	// RegistrationTTL is how long a write's registration lasts unrenewed
	// (see SweepOrphans); 0 means DefaultRegistrationTTL. A write renews it
	// every twelfth of it, at most every DefaultRenewal.
	RegistrationTTL time.Duration

	// Tests only: how often a write renews its registration and how long
	// one lasts unrenewed (0: the defaults), and crash, which leaves a
	// failed attempt's chunks and registration behind as a writer killed
	// mid-spill would.
	beat, markerTTL time.Duration
	crash           bool
}

// Validate reports every problem with s at once.
func (s *Store) Validate() error {
	var errs []error
	if s.JS == nil {
		errs = append(errs, errors.New("spill: Store.JS is nil: a JetStream context is required"))
	}
	if s.Stream == "" {
		errs = append(errs, errors.New("spill: Store.Stream is empty: name the events stream, e.g. SEAMGUARD_EVENTS"))
	} else if !validName(s.Stream) {
		errs = append(errs, fmt.Errorf("spill: Store.Stream %q is not a valid stream name (letters, digits, '_' and '-')", s.Stream))
	}
	if s.Bucket == "" {
		errs = append(errs, errors.New("spill: Store.Bucket is empty: name the object store bucket, e.g. "+Bucket))
	} else if !validName(s.Bucket) {
		errs = append(errs, fmt.Errorf("spill: Store.Bucket %q is not a valid bucket name (letters, digits, '_' and '-')", s.Bucket))
	}
	if err := s.Subjects.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("spill: Store.Subjects: %w", err))
	}
	if s.Retries < 0 {
		errs = append(errs, fmt.Errorf("spill: Store.Retries is %d; use 0 for the default of %d, or a positive number", s.Retries, DefaultRetries))
	}
	if s.RegistrationTTL < 0 || s.RegistrationTTL > 0 && s.RegistrationTTL < time.Second {
		errs = append(errs, fmt.Errorf("spill: Store.RegistrationTTL is %s; use 0 for the default of %s, or a second or more", s.RegistrationTTL, DefaultRegistrationTTL))
	}
	if s.ChunkSize < 0 {
		errs = append(errs, fmt.Errorf("spill: Store.ChunkSize is %d; use 0 for the default of %d, or a positive size", s.ChunkSize, DefaultChunkSize))
	}
	if s.Backoff < 0 {
		errs = append(errs, fmt.Errorf("spill: Store.Backoff is %s; use 0 for the default of %s, or a positive duration", s.Backoff, DefaultBackoff))
	}
	if s.MaxChain < 0 {
		errs = append(errs, fmt.Errorf("spill: Store.MaxChain is %d; use 0 for the default of %d, or a positive number", s.MaxChain, DefaultMaxChain))
	}
	if err := s.Ledger.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("spill: Store.Ledger: %w", err))
	}
	return errors.Join(errs...)
}

// validName is the character set both stream and bucket names allow.
func validName(n string) bool {
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return n != ""
}

func (s *Store) retries() int {
	if s.Retries == 0 {
		return DefaultRetries
	}
	return s.Retries
}

func (s *Store) maxChain() int {
	if s.MaxChain == 0 {
		return DefaultMaxChain
	}
	return s.MaxChain
}

func (s *Store) chunkSize() int {
	if s.ChunkSize > 0 {
		return s.ChunkSize
	}
	size := DefaultChunkSize
	if mp := int(s.JS.Conn().MaxPayload()); mp > 0 {
		size = min(size, mp/2)
	}
	return size
}

func (s *Store) backoff() time.Duration {
	if s.Backoff == 0 {
		return DefaultBackoff
	}
	return s.Backoff
}

func checkRequest(req ledger.SpillRequest) error {
	var p []string
	if req.Name == "" {
		p = append(p, "the object name is empty")
	}
	if !events.ValidSessionID(req.Session) {
		p = append(p, fmt.Sprintf("session %q is not a valid session id", req.Session))
	}
	if req.FirstSeq == 0 || req.LastSeq < req.FirstSeq {
		p = append(p, fmt.Sprintf("stream sequences %d to %d are not a range", req.FirstSeq, req.LastSeq))
	}
	if req.Events == 0 {
		p = append(p, "it holds no events")
	}
	if req.Events > req.LastSeq-req.FirstSeq+1 && req.LastSeq >= req.FirstSeq {
		p = append(p, fmt.Sprintf("%d events cannot lie between stream sequences %d and %d", req.Events, req.FirstSeq, req.LastSeq))
	}
	if req.Range.Start > req.Range.End {
		p = append(p, fmt.Sprintf("range [%d, %d) is not a range", req.Range.Start, req.Range.End))
	}
	if req.Previous != "" && req.Previous == req.Name {
		p = append(p, "it names itself as its previous spill")
	}
	if len(p) == 0 {
		return nil
	}
	return permanent(fmt.Errorf("spill: bad spill request %q: %v", req.Name, p))
}

// Write writes the spill req asks for into the bucket and returns its
// handle once the object is stored and its digest checked.
//
// The object holds the session's accepted events from req.FirstSeq to
// req.LastSeq, read from the events stream and streamed into the object
// store: it is never held in memory whole. Which events the processor
// accepted is decided by replaying them through a shadow ledger (see the
// package doc); for a spill with a previous one, the replay starts from the
// state stored with that spill, or, when it cannot be read, from the
// session's first event. If the stream can no longer yield the transcript
// (events aged out, purged or deleted), Write returns an error wrapping
// ErrIncomplete at once. A quota (req.MaxBytes) the transcript would
// exceed gives ErrQuota, a bucket or server out of storage ErrStorageFull,
// other failures no attempt can cure ErrPermanent, all at once. Other
// object store failures are retried up to Retries times, Backoff apart
// (doubling); the last error is returned. Cancelling ctx stops Write
// promptly; nothing it started keeps running. A failed attempt leaves
// nothing in the bucket.
func (s *Store) Write(ctx context.Context, req ledger.SpillRequest) (events.SpillHandle, error) {
	if err := s.Validate(); err != nil {
		return events.SpillHandle{}, err
	}
	if err := checkRequest(req); err != nil {
		return events.SpillHandle{}, err
	}
	wait := s.backoff()
	for attempt := 1; ; attempt++ {
		h, err := s.writeOnce(ctx, req)
		if err == nil {
			return h, nil
		}
		if ctx.Err() != nil {
			return events.SpillHandle{}, fmt.Errorf("spill: write %s: stopped after %d attempt(s): %w (last error: %w)", req.Name, attempt, ctx.Err(), err)
		}
		err = classify(err, s.JS.Conn(), s.Bucket)
		if !retryable(err) {
			return events.SpillHandle{}, err
		}
		if attempt >= s.retries() {
			return events.SpillHandle{}, fmt.Errorf("spill: write %s to bucket %s: gave up after %d attempts: %w", req.Name, s.Bucket, attempt, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return events.SpillHandle{}, fmt.Errorf("spill: write %s: stopped after %d attempt(s): %w (last error: %w)", req.Name, attempt, ctx.Err(), err)
		case <-t.C:
		}
		wait = min(2*wait, maxBackoff)
	}
}

// writeOnce is one attempt: read the transcript, put it, check it.
func (s *Store) writeOnce(ctx context.Context, req ledger.SpillRequest) (events.SpillHandle, error) {
	obs, err := s.JS.ObjectStore(ctx, s.Bucket)
	if err != nil {
		return events.SpillHandle{}, fmt.Errorf("spill: open bucket %s: %w", s.Bucket, err)
	}
	str, err := s.JS.Stream(ctx, s.Stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			// Deleted by an operator, or a cluster whose meta leader has
			// not yet learned of it after a restart: either way nothing
			// says the events are gone until a stream of that name answers.
			return events.SpillHandle{}, fmt.Errorf("%w: events stream %s is not found, so session %s's transcript cannot be read now: %w", ErrUnavailable, s.Stream, req.Session, err)
		}
		return events.SpillHandle{}, fmt.Errorf("spill: open stream %s: %w", s.Stream, err)
	}
	if err := s.checkEnds(ctx, str, req); err != nil {
		return events.SpillHandle{}, err
	}

	// The name's object before this one (if any): its chunks go once the
	// new info has replaced it, as the object store's own Put does.
	old, err := obs.GetInfo(ctx, req.Name, jetstream.GetObjectInfoShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return events.SpillHandle{}, fmt.Errorf("spill: read the info of %s in bucket %s: %w", req.Name, s.Bucket, err)
	}
	rp := s.plan(ctx, obs, req)
	a := &attempt{s: s, ctx: ctx, req: req, obs: obs, info: s.newInfo(req), stateNUID: nuid.Next()}
	reg, err := s.register(ctx, req.Name, a.info.NUID, a.stateNUID)
	if err != nil {
		return events.SpillHandle{}, err
	}
	h, err := a.put(rp, reg)
	if err != nil {
		a.abandon(reg)
		if a.putErr != nil && ctx.Err() == nil {
			return events.SpillHandle{}, fmt.Errorf("spill: put %s into bucket %s: %w", req.Name, s.Bucket, a.putErr)
		}
		return events.SpillHandle{}, err
	}
	reg.end(ctx, true)
	if err := s.check(ctx, a, old); err != nil {
		return events.SpillHandle{}, err
	}
	return h, nil
}

// newInfo is the info of req's spill, before its chunks are written: a
// new NUID for them, and the metadata of the request.
func (s *Store) newInfo(req ledger.SpillRequest) *jetstream.ObjectInfo {
	info := &jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{
			Name:        req.Name,
			Description: fmt.Sprintf("seamguard transcript of session %s: %d events, stream sequences %d to %d", req.Session, req.Events, req.FirstSeq, req.LastSeq),
			Metadata: map[string]string{
				metaSession:    req.Session,
				metaRangeStart: strconv.FormatUint(req.Range.Start, 10),
				metaRangeEnd:   strconv.FormatUint(req.Range.End, 10),
				metaEvents:     strconv.FormatUint(req.Events, 10),
				metaFirstSeq:   strconv.FormatUint(req.FirstSeq, 10),
				metaLastSeq:    strconv.FormatUint(req.LastSeq, 10),
			},
			Opts: &jetstream.ObjectMetaOptions{ChunkSize: uint32(s.chunkSize())},
		},
		Bucket: s.Bucket,
		NUID:   nuid.Next(),
	}
	if req.Previous != "" {
		info.Description += ", after " + req.Previous
		info.Metadata[metaPrevious] = req.Previous
	}
	return info
}

// attempt is one write of a spill while its chunks are put.
type attempt struct {
	s         *Store
	ctx       context.Context
	req       ledger.SpillRequest
	obs       jetstream.ObjectStore
	info      *jetstream.ObjectInfo
	stateNUID string        // the NUID of the replay state's chunks
	ow, sw    *objectWriter // the transcript's chunks, the state's
	w         *Writer       // what the transcript's chunks are written through
	putErr    error         // the bucket's failure, which a write's error wraps
}

// put writes the transcript straight from the stream into chunks, each
// published as it fills with at most putWindow awaiting their acks; the
// replay's state follows in chunks of its own, and the info only once
// every chunk is stored. The write is registered meanwhile (reg), so that
// SweepOrphans leaves its chunks alone. On an error the caller abandons
// the attempt.
func (a *attempt) put(rp *replay, reg *registration) (events.SpillHandle, error) {
	s, req, info := a.s, a.req, a.info
	size := s.chunkSize()
	a.ow = newObjectWriter(a.ctx, s.JS, s.Bucket, info.NUID, size)
	a.w = &Writer{w: a.ow, max: req.MaxBytes}
	err := s.produce(a.ctx, req, rp, a.w)
	if err == nil {
		err = a.ow.close()
	}
	a.putErr = a.ow.err
	if err != nil {
		return events.SpillHandle{}, err
	}
	info.Size, info.Chunks, info.Digest = a.ow.total, a.ow.chunks, a.ow.digest()
	if idx := a.ow.seqs.String(); idx != "" {
		info.Metadata[metaChunkSeqs] = idx
	}
	h := events.SpillHandle{
		Bucket: s.Bucket, Name: req.Name, Digest: info.Digest, Size: info.Size,
		Range: req.Range, Events: a.w.Events(), FirstSeq: req.FirstSeq, LastSeq: req.LastSeq,
	}
	if req.Previous != "" {
		prev := req.Previous
		h.Previous = &prev
	}
	state, err := rp.finish(h, s.Ledger)
	if err != nil {
		return events.SpillHandle{}, err
	}
	a.sw = newObjectWriter(a.ctx, s.JS, s.Bucket, a.stateNUID, size)
	if _, err = a.sw.Write(state); err == nil {
		err = a.sw.close()
	}
	a.putErr = a.sw.err
	if err != nil {
		return events.SpillHandle{}, err
	}
	info.Metadata[metaStateNUID] = a.stateNUID
	info.Metadata[metaStateChunks] = strconv.FormatUint(uint64(a.sw.chunks), 10)
	info.Metadata[metaStateSize] = strconv.FormatUint(a.sw.total, 10)
	info.Metadata[metaStateDigest] = a.sw.digest()
	info.Metadata[metaStateSeq] = strconv.FormatUint(req.LastSeq, 10)
	if err := reg.lapsed(); err != nil {
		return events.SpillHandle{}, err
	}
	a.putErr = s.putInfo(a.ctx, a.obs, info)
	return h, a.putErr
}

// abandon purges the chunks an attempt that failed sent (unless the
// store simulates a crash), so that the bucket never holds an info that
// names missing chunks, nor chunks no info names, and ends its
// registration.
func (a *attempt) abandon(reg *registration) {
	for _, o := range []*objectWriter{a.ow, a.sw} {
		if o != nil {
			o.abandon()
			if !a.s.crash {
				a.s.purgeChunks(a.ctx, o.subject)
			}
		}
	}
	reg.end(a.ctx, !a.s.crash)
}

// check finishes a spill put: its size is what was written, the chunks of
// the name's object before it (old) are purged, and the bucket holds the
// spill written (read back whole with Verify).
func (s *Store) check(ctx context.Context, a *attempt, old *jetstream.ObjectInfo) error {
	req, info := a.req, a.info
	if info.Size != a.w.Size() {
		return fmt.Errorf("%w: put %s stored %d bytes, but %d bytes were written",
			ErrDigestMismatch, req.Name, info.Size, a.w.Size())
	}
	if old != nil && !old.Deleted && old.NUID != info.NUID {
		s.purgeChunks(ctx, ChunkSubject(s.Bucket, old.NUID))
		if st := old.Metadata[metaStateNUID]; st != "" && st != a.stateNUID {
			s.purgeChunks(ctx, ChunkSubject(s.Bucket, st))
		}
	}
	stored, err := a.obs.GetInfo(ctx, req.Name)
	if err != nil {
		return fmt.Errorf("spill: read back info of %s: %w", req.Name, err)
	}
	// Another writer of the same spill (an instance that lost the session
	// while it spilled) may have put it again since: the same name, size
	// and digest are the same transcript, and what the handle names.
	if stored.Digest != info.Digest || stored.Size != info.Size {
		return fmt.Errorf("%w: bucket %s holds %s with %d bytes and digest %s, but %d bytes with digest %s were written (was it overwritten?)",
			ErrDigestMismatch, s.Bucket, req.Name, stored.Size, stored.Digest, info.Size, info.Digest)
	}
	if s.Verify {
		// stored is the version just put, and its digest is w's: reading
		// it back whole proves the bytes in the bucket are the ones written.
		return s.read(ctx, stored, io.Discard)
	}
	return nil
}

// checkEnds makes sure the transcript's last event, and for a chain's
// first spill its first, are still in the stream before anything is read.
func (s *Store) checkEnds(ctx context.Context, str jetstream.Stream, req ledger.SpillRequest) error {
	type end struct {
		seq  uint64
		what string
	}
	ends := []end{{req.LastSeq, "last event (the compaction request)"}}
	if req.Previous == "" {
		ends = append([]end{{req.FirstSeq, "first event (its session.opened)"}}, ends...)
	}
	for _, e := range ends {
		if err := s.checkSeq(ctx, str, req.Session, e.seq, e.what); err != nil {
			return err
		}
	}
	return nil
}

// checkSeq makes sure the stream holds session's event at seq.
func (s *Store) checkSeq(ctx context.Context, str jetstream.Stream, session string, seq uint64, what string) error {
	m, err := s.leaderMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		m, err = s.confirmGone(ctx, str, session, seq)
	case err != nil:
		err = fmt.Errorf("spill: read stream %s at sequence %d: %w", s.Stream, seq, err)
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("%w: session %s's %s at stream sequence %d is no longer in stream %s (aged out, purged or deleted); the transcript cannot be spilled whole",
			ErrIncomplete, session, what, seq, s.Stream)
	case err != nil:
		return err
	case !s.Subjects.HoldsInput(session, m.Subject):
		return fmt.Errorf("%w: stream %s holds %s at sequence %d, not session %s's %s",
			ErrIncomplete, s.Stream, m.Subject, seq, session, what)
	}
	return nil
}

// confirmGone reads seq again after its leader answered that it holds no
// such message, and returns the message, or jetstream.ErrMsgNotFound only
// when the stream is sure: the transcript's sequences were all delivered
// from this stream, and a leader elected a moment ago may answer before it
// has applied its log. So the leader must first show that it has applied
// seq (its state ends at seq or later), then not find it, and still be the
// leader afterwards; anything else is ErrUnavailable, for a later attempt.
func (s *Store) confirmGone(ctx context.Context, str jetstream.Stream, session string, seq uint64) (*jetstream.RawStreamMsg, error) {
	unavailable := func(why string) error {
		return fmt.Errorf("%w: stream %s answered that it holds no sequence %d, %s; session %s's transcript cannot be read now",
			ErrUnavailable, s.Stream, seq, why, session)
	}
	before, err := str.Info(ctx)
	switch {
	case err != nil:
		return nil, unavailable(fmt.Sprintf("and its state cannot be read (%v)", err))
	case before.State.LastSeq < seq:
		return nil, unavailable(fmt.Sprintf("and its state ends at %d (a new leader still applying what it was sent?)", before.State.LastSeq))
	}
	m, err := s.leaderMsg(ctx, seq)
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		if err != nil {
			return nil, fmt.Errorf("spill: read stream %s at sequence %d: %w", s.Stream, seq, err)
		}
		return m, nil
	}
	after, err := str.Info(ctx)
	switch {
	case err != nil:
		return nil, unavailable(fmt.Sprintf("and its state cannot be read again (%v)", err))
	case leaderOf(after) != leaderOf(before):
		return nil, unavailable(fmt.Sprintf("while its leader changed from %q to %q", leaderOf(before), leaderOf(after)))
	}
	return nil, jetstream.ErrMsgNotFound
}

// leaderMsg reads the events stream's message at seq as its leader
// answers (STREAM.MSG.GET): the stream allows direct gets, which
// Stream.GetMsg would send, and a replica behind the leader may answer
// those. jetstream.ErrMsgNotFound when there is none.
func (s *Store) leaderMsg(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	got, err := leaderGet(ctx, s.JS.Conn(), s.Stream, seq)
	switch {
	case err != nil:
		return nil, err
	case got == nil:
		return nil, jetstream.ErrMsgNotFound
	}
	return &jetstream.RawStreamMsg{Subject: got.Subject, Sequence: got.Seq, Header: got.Header, Data: got.Data, Time: got.Time}, nil
}

// leaderGet is jsread.LeaderGet by sequence; tests make it answer as a
// leader that has not applied its log yet.
var leaderGet = func(ctx context.Context, nc *nats.Conn, stream string, seq uint64) (*jsread.Msg, error) {
	return jsread.LeaderGet(ctx, nc, stream, seq, "")
}

// leaderOf names the stream's leader in info ("" on a single server).
func leaderOf(info *jetstream.StreamInfo) string {
	if info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// produce reads the session's events with an ordered consumer, from where
// rp starts the replay to req.LastSeq, replays each through rp's shadow
// ledger and writes to w the accepted ones from req.FirstSeq on.
func (s *Store) produce(ctx context.Context, req ledger.SpillRequest, rp *replay, w *Writer) error {
	it, stop, err := s.transcript(ctx, req, rp)
	if err != nil {
		return err
	}
	defer stop()
	var (
		last uint64   // stream sequence of the last event read
		line []byte   // each event's encoding, in one reused buffer
		read seqsRead // what the reader delivered, to compare with the leader's
	)
	// Each pass reads one message at a higher sequence (an ordered
	// consumer), or fails: the loop ends by req.LastSeq.
	for last < req.LastSeq {
		msg, err := s.next(ctx, it, req, last)
		if err != nil {
			return err
		}
		md, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("spill: read stream %s: %w", s.Stream, err)
		}
		seq := md.Sequence.Stream
		if readerLacks != nil && readerLacks(seq) {
			continue
		}
		if err := s.inOrder(req, rp, seq, last); err != nil {
			return s.leaderAgrees(ctx, req, rp, seq, last, nil, err)
		}
		read.add(seq)
		last = seq
		out := w
		if seq < req.FirstSeq {
			out = nil // replayed for the state it leaves, held by an earlier spill
		}
		if err := s.apply(rp, req, msg, seq, out, &line); err != nil {
			return err
		}
		if seq < req.LastSeq && md.NumPending == 0 {
			return s.cutShort(ctx, req, seq)
		}
	}
	// Checked before the last chunk goes out, so that no info is ever
	// written for a transcript with holes.
	if w.Events() != req.Events {
		err := fmt.Errorf("%w: stream %s holds %d accepted events of session %s between sequences %d and %d, but the ledger counted %d: some were deleted%s",
			ErrIncomplete, s.Stream, w.Events(), req.Session, req.FirstSeq, req.LastSeq, req.Events, rp.because())
		return s.leaderAgrees(ctx, req, rp, 0, last, &read, err)
	}
	return nil
}

// readerLacks, when set (by tests), makes the transcript's reader skip the
// events it names, as a consumer on a replica that lacks them would.
var readerLacks func(seq uint64) bool

// seqsRead sums up the stream sequences a transcript's reader delivered:
// how many, and a hash of them in order.
type seqsRead struct {
	n   uint64
	sum uint64
}

func (r *seqsRead) add(seq uint64) {
	const prime = 1099511628211 // FNV-64
	if r.n == 0 {
		r.sum = 14695981039346656037
	}
	r.n++
	for i := range 8 {
		r.sum ^= (seq >> (8 * i)) & 0xff
		r.sum *= prime
	}
}

// leaderAgrees checks a transcript the reader found incomplete (incomplete,
// wrapping ErrIncomplete) against the events stream's leader, since the
// reader's consumer may sit on a replica that lacks events its leader
// holds (one catching up after a restart): incomplete when the leader
// agrees, ErrUnavailable (for a later attempt) when it holds what the
// reader missed or cannot tell now. seq is the event read out of order
// (0: none), last the one read before it; read, when not nil, is every
// sequence the reader delivered up to req.LastSeq, which must be the
// leader's sequences of the session's events from where the replay starts.
func (s *Store) leaderAgrees(ctx context.Context, req ledger.SpillRequest, rp *replay, seq, last uint64, read *seqsRead, incomplete error) error {
	if !errors.Is(incomplete, ErrIncomplete) {
		return incomplete
	}
	str, err := s.JS.Stream(ctx, s.Stream)
	if err != nil {
		return fmt.Errorf("%w: %v; the events stream's leader cannot confirm it now: %v", ErrUnavailable, incomplete, err)
	}
	switch {
	case read == nil && last == 0 && rp.first && seq != rp.from:
		err = s.checkSeq(ctx, str, req.Session, rp.from, "first event")
	case read == nil:
		err = s.checkSeq(ctx, str, req.Session, req.LastSeq, "last event (the compaction request)")
	default:
		err = s.sameSeqs(ctx, str, req, rp, read)
	}
	switch {
	case errors.Is(err, ErrIncomplete):
		return incomplete // the leader agrees: what it says is the reader's
	case err != nil:
		return fmt.Errorf("%w: %v; the events stream's leader cannot confirm it now: %v", ErrUnavailable, incomplete, err)
	}
	return fmt.Errorf("%w: the transcript's reader found session %s's events incomplete, but the events stream's leader holds them (a replica catching up?): %v",
		ErrUnavailable, req.Session, incomplete)
}

// sameSeqs reads the sequences of the session's events from where rp
// starts to req.LastSeq from the events stream's leader (STREAM.MSG.GET):
// ErrIncomplete when they are the ones the reader delivered, nil when
// they differ. The leader must hold req.LastSeq before and be the same
// after, as in confirmGone; otherwise ErrUnavailable.
func (s *Store) sameSeqs(ctx context.Context, str jetstream.Stream, req ledger.SpillRequest, rp *replay, read *seqsRead) error {
	before, err := str.Info(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: stream %s's state cannot be read: %w", ErrUnavailable, s.Stream, err)
	case before.State.LastSeq < req.LastSeq:
		return fmt.Errorf("%w: stream %s's state ends at %d, before %d", ErrUnavailable, s.Stream, before.State.LastSeq, req.LastSeq)
	}
	var leader seqsRead
	r := &jsread.Reader{JS: s.JS, Stream: s.Stream, Timeout: readIdle}
	err = r.Read(ctx, max(rp.from, 1), req.LastSeq, s.Subjects.SessionFilters(req.Session), func(m *jsread.Msg) error {
		leader.add(m.Seq)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: read stream %s from its leader: %w", ErrUnavailable, s.Stream, err)
	}
	after, err := str.Info(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("%w: stream %s's state cannot be read again: %w", ErrUnavailable, s.Stream, err)
	case leaderOf(after) != leaderOf(before):
		return fmt.Errorf("%w: stream %s's leader changed from %q to %q", ErrUnavailable, s.Stream, leaderOf(before), leaderOf(after))
	case leader != *read:
		return nil
	}
	return ErrIncomplete
}

// transcript opens an ordered consumer of the session's events from where
// rp starts the replay, and its message iterator; stop closes both.
func (s *Store) transcript(ctx context.Context, req ledger.SpillRequest, rp *replay) (it jetstream.MessagesContext, stop func(), err error) {
	cc := jetstream.OrderedConsumerConfig{
		FilterSubjects:    s.Subjects.SessionFilters(req.Session),
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       rp.from,
		InactiveThreshold: time.Minute,
		MaxResetAttempts:  3,
	}
	if rp.from == 0 {
		cc.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	cons, err := s.JS.OrderedConsumer(ctx, s.Stream, cc)
	if err != nil {
		return nil, nil, fmt.Errorf("spill: read stream %s: %w", s.Stream, err)
	}
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		s.dropConsumer(ctx, s.Stream, cons)
		return nil, nil, s.noneSeen(ctx, req, rp)
	}
	// At most 256 events buffered, and each pull asks for at most 1 MiB (or
	// the largest message, so that none stalls it), so a pull answers with a
	// few hundred KiB of small events, or one big one. (PullMaxBytes alone
	// would allocate a channel for a million messages.)
	pull := max(1<<20, int(s.JS.Conn().MaxPayload()))
	it, err = cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(256, pull))
	if err != nil {
		s.dropConsumer(ctx, s.Stream, cons)
		return nil, nil, fmt.Errorf("spill: read stream %s: %w", s.Stream, err)
	}
	return it, func() { it.Stop(); s.dropConsumer(ctx, s.Stream, cons) }, nil
}

// noneSeen is the failure of a transcript whose reader sees no event: the
// consumer may sit on a replica that lags its leader (after a partition
// heals), and only the leader can say that the events are gone.
func (s *Store) noneSeen(ctx context.Context, req ledger.SpillRequest, rp *replay) error {
	str, err := s.JS.Stream(ctx, s.Stream)
	if err == nil {
		err = s.checkEnds(ctx, str, req)
	}
	if errors.Is(err, ErrIncomplete) {
		return fmt.Errorf("stream %s holds no event of session %s from sequence %d on (aged out or purged): %w",
			s.Stream, req.Session, max(rp.from, 1), err)
	}
	return fmt.Errorf("%w: the reader of stream %s sees no event of session %s from sequence %d on, but the stream's leader does not say they are gone (%v)",
		ErrUnavailable, s.Stream, req.Session, max(rp.from, 1), err)
}

// inOrder checks the stream sequence seq of the event read after last: the
// first is where the replay starts when that is the session's first event,
// none is past the request, and each is after the one before.
func (s *Store) inOrder(req ledger.SpillRequest, rp *replay, seq, last uint64) error {
	switch {
	case last == 0 && rp.first && seq != rp.from:
		return fmt.Errorf("%w: session %s's first event at stream sequence %d is no longer in stream %s; its oldest remaining event is at %d%s",
			ErrIncomplete, req.Session, rp.from, s.Stream, seq, rp.because())
	case seq > req.LastSeq:
		return fmt.Errorf("%w: session %s's compaction request at stream sequence %d is no longer in stream %s; the next event read is at %d",
			ErrIncomplete, req.Session, req.LastSeq, s.Stream, seq)
	case seq <= last:
		return fmt.Errorf("spill: read stream %s: sequence %d after %d", s.Stream, seq, last)
	}
	return nil
}

// cutShort is the failure of a transcript whose reader sees nothing after
// seq, before its end: the consumer may sit on a replica that lags, and
// only the stream's leader can say the end is gone.
func (s *Store) cutShort(ctx context.Context, req ledger.SpillRequest, seq uint64) error {
	str, err := s.JS.Stream(ctx, s.Stream)
	if err == nil {
		err = s.checkEnds(ctx, str, req)
	}
	if errors.Is(err, ErrIncomplete) {
		return err
	}
	return fmt.Errorf("%w: the reader of stream %s sees no event of session %s after sequence %d, but the transcript ends at %d and the stream still holds it",
		ErrUnavailable, s.Stream, req.Session, seq, req.LastSeq)
}

// next waits for the next message, at most readIdle at a time. When that
// passes it checks the stream: a transcript whose end is gone is
// incomplete; otherwise the stream is slow and the attempt fails (and may be
// retried).
func (s *Store) next(ctx context.Context, it jetstream.MessagesContext, req ledger.SpillRequest, last uint64) (jetstream.Msg, error) {
	nctx, cancel := context.WithTimeout(ctx, readIdle)
	defer cancel()
	msg, err := it.Next(jetstream.NextContext(nctx))
	if err == nil {
		return msg, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if nctx.Err() != nil {
		str, serr := s.JS.Stream(ctx, s.Stream)
		if serr == nil {
			serr = s.checkEnds(ctx, str, req)
		}
		if errors.Is(serr, ErrIncomplete) {
			return nil, serr
		}
		return nil, fmt.Errorf("%w: no event of session %s arrived from stream %s within %s after sequence %d (the transcript ends at %d)",
			ErrUnavailable, req.Session, s.Stream, readIdle, last, req.LastSeq)
	}
	// The consumer failed (its server went away and it could not be made
	// again, its heartbeats stopped): nothing says the events are gone.
	return nil, fmt.Errorf("%w: read stream %s: %w", ErrUnavailable, s.Stream, err)
}

// apply replays one message through the shadow ledger and, when w is not
// nil, writes it if the processor accepted it.
func (s *Store) apply(rp *replay, req ledger.SpillRequest, msg jetstream.Msg, seq uint64, w *Writer, buf *[]byte) error {
	// The message is read for this replay alone: the event may keep its
	// header and data.
	ev, err := events.DecodeMsgOwned(msg.Subject(), msg.Headers(), msg.Data(), s.Subjects)
	if err != nil {
		return nil // rejected by the processor too: not part of the transcript
	}
	ev.Meta.Seq = seq
	res, err := ledger.Step(&rp.shadow, ledger.Input{Event: ev}, s.Ledger)
	if err != nil {
		return permanent(fmt.Errorf("spill: replay of stream sequence %d: %w", seq, err))
	}
	if res.Spill != nil && seq != req.LastSeq {
		// An earlier spill: it succeeded if the chain holds it, and
		// failed otherwise (the spill after it would name it as its
		// previous). The request at LastSeq is this spill, answered
		// once it is written (replay.finish).
		answer := ledger.SpillResult{Failure: "not in the chain"}
		if h, ok := rp.chain[seq]; ok {
			answer = ledger.SpillResult{Handle: h}
		}
		if _, err := ledger.Step(&rp.shadow, ledger.Input{Spill: &answer}, s.Ledger); err != nil {
			return permanent(fmt.Errorf("spill: replay of stream sequence %d: %w", seq, err))
		}
	}
	if !res.Accepted || w == nil {
		return nil
	}
	line, err := events.AppendStructured((*buf)[:0], ev)
	if err != nil {
		return permanent(fmt.Errorf("spill: encode the event at stream sequence %d: %w", seq, err))
	}
	*buf = line
	return w.WriteLine(line) // fails when the quota is reached or the bucket refused a chunk
}

// FullReader fills every buffer it is given unless R ends: nats.go's
// object store Put makes one chunk of each Read, and a pipe returns one
// Write at a time, which would halve the chunk size. The bench's reference
// pipe reads through it.
type FullReader struct{ R io.Reader }

func (f FullReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.R, p)
	if err == io.ErrUnexpectedEOF {
		err = nil // the last, short chunk; the next Read returns io.EOF
	}
	return n, err
}

// Info returns the info of the spill called name. When there is none the
// error matches jetstream.ErrObjectNotFound.
func (s *Store) Info(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	obs, err := s.JS.ObjectStore(ctx, s.Bucket)
	if err != nil {
		return nil, fmt.Errorf("spill: open bucket %s: %w", s.Bucket, err)
	}
	info, err := obs.GetInfo(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("spill: info of %s in bucket %s: %w", name, s.Bucket, err)
	}
	return info, nil
}

// Get streams the spill called name to w and verifies it: its size, chunk
// count and digest must match its info, else the error wraps
// ErrDigestMismatch (reported after the bytes were copied). A missing name
// is an error matching jetstream.ErrObjectNotFound.
//
// Get reads the object's chunks with batched direct gets (package jsread:
// no consumer, so an identity that may not create one reads spills too),
// a few MiB a request, rather than with nats.go's ObjectStore.Get, whose
// push consumer lets up to 32 MB of chunks queue in the client, and which
// allows 5 seconds for the whole object when ctx has no deadline. Here ctx
// bounds the whole read and each answer may take up to 10 seconds.
func (s *Store) Get(ctx context.Context, name string, w io.Writer) (*jetstream.ObjectInfo, error) {
	info, err := s.Info(ctx, name)
	if err != nil {
		return nil, err
	}
	return info, s.read(ctx, info, w)
}

// read streams the chunks of the object info describes to w and checks
// them against info.
func (s *Store) read(ctx context.Context, info *jetstream.ObjectInfo, w io.Writer) error {
	if info.Opts != nil && info.Opts.Link != nil {
		return fmt.Errorf("spill: %s in bucket %s is a link, not a spill", info.Name, info.Bucket)
	}
	mismatch := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s in bucket %s (version %s): %s (%w)",
			ErrDigestMismatch, info.Name, info.Bucket, info.NUID, fmt.Sprintf(format, args...), jetstream.ErrDigestMismatch)
	}
	h := sha256.New()
	var size uint64
	var chunks uint32
	if info.Chunks > 0 {
		stream := StreamName(info.Bucket)
		subj := ChunkSubject(info.Bucket, info.NUID)
		// A reader that sees too few chunks may be answered by a replica
		// that lags its leader (after a partition heals): the leader says
		// whether the chunks are gone (a mismatch) or not read yet
		// (unavailable).
		short := func(seen uint32) error {
			n, err := s.held(ctx, stream, subj)
			if err == nil && n < uint64(info.Chunks) {
				return mismatch("the bucket holds only %d of its %d chunks", n, info.Chunks)
			}
			return fmt.Errorf("%w: the reader of bucket %s sees %d of the %d chunks of %s, but the bucket's leader holds them (%d; %v): a replica behind its leader? try again",
				ErrUnavailable, info.Bucket, seen, info.Chunks, info.Name, n, err)
		}
		chunk := 128 << 10
		if info.Opts != nil && info.Opts.ChunkSize > 0 {
			chunk = int(info.Opts.ChunkSize)
		}
		// Batched direct gets of the chunk subject (the object store's
		// stream allows them), answered to this connection's inbox: no
		// consumer. Each batch stops after 2 MiB or 4 chunks, whichever is
		// more; Confirm is off, the chunk count is checked instead.
		r := &jsread.Reader{JS: s.JS, Stream: stream, Direct: true, MaxBytes: max(2<<20, 4*chunk), Timeout: readIdle}
		errEnough := errors.New("spill: all chunks read")
		err := r.Read(ctx, 1, math.MaxUint64, []string{subj}, func(m *jsread.Msg) error {
			h.Write(m.Data)
			if _, err := w.Write(m.Data); err != nil {
				return fmt.Errorf("spill: copy %s: %w", info.Name, err)
			}
			size += uint64(len(m.Data))
			chunks++
			if chunks == info.Chunks {
				return errEnough
			}
			return nil
		})
		switch {
		case errors.Is(err, errEnough):
		case err != nil:
			return fmt.Errorf("spill: read %s from bucket %s after %d of %d chunks: %w", info.Name, info.Bucket, chunks, info.Chunks, err)
		case chunks < info.Chunks:
			return short(chunks)
		}
	}
	if got := jetstream.GetObjectDigestValue(h); got != info.Digest || size != info.Size {
		return mismatch("read back %d bytes in %d chunks with digest %s; its info says %d bytes in %d chunks with digest %s",
			size, chunks, got, info.Size, info.Chunks, info.Digest)
	}
	return nil
}

// held asks the stream's leader how many messages it holds on subject.
func (s *Store) held(ctx context.Context, stream, subject string) (uint64, error) {
	str, err := s.JS.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := str.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[subject], nil
}

// dropConsumer deletes an ordered consumer once it is no longer read, rather
// than leaving it to expire on the server.
func (s *Store) dropConsumer(ctx context.Context, stream string, cons jetstream.Consumer) {
	if ci := cons.CachedInfo(); ci != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = s.JS.DeleteConsumer(dctx, stream, ci.Name)
		cancel()
	}
}

// HandleOf rebuilds the handle of a spill Write stored, from its info
// alone. It fails for objects Write did not write.
func HandleOf(info *jetstream.ObjectInfo) (events.SpillHandle, error) {
	var (
		nums [5]uint64
		keys = [5]string{metaRangeStart, metaRangeEnd, metaEvents, metaFirstSeq, metaLastSeq}
	)
	for i, k := range keys {
		v, ok := info.Metadata[k]
		if !ok {
			return events.SpillHandle{}, fmt.Errorf("spill: object %s in bucket %s has no %s metadata: it was not written by a spill Store", info.Name, info.Bucket, k)
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return events.SpillHandle{}, fmt.Errorf("spill: object %s in bucket %s: metadata %s=%q is not a number", info.Name, info.Bucket, k, v)
		}
		nums[i] = n
	}
	h := events.SpillHandle{
		Bucket:   info.Bucket,
		Name:     info.Name,
		Digest:   info.Digest,
		Size:     info.Size,
		Range:    events.Range{Start: nums[0], End: nums[1]},
		Events:   nums[2],
		FirstSeq: nums[3],
		LastSeq:  nums[4],
	}
	if p := info.Metadata[metaPrevious]; p != "" {
		h.Previous = &p
	}
	return h, nil
}
