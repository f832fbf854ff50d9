package spill

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// Defaults of Store.
const (
	DefaultRetries = 3
	DefaultBackoff = 200 * time.Millisecond
)

// readIdle bounds how long Write waits for the next event of a transcript
// (or Get for the next chunk) before it gives up; Write first asks the
// stream whether the transcript's end is still there.
const readIdle = 10 * time.Second

// Object metadata keys Write sets, so that a handle can be rebuilt from the
// object's info alone (see HandleOf).
const (
	metaSession    = "seamguard-session"
	metaRangeStart = "seamguard-range-start"
	metaRangeEnd   = "seamguard-range-end"
	metaEvents     = "seamguard-events"
	metaFirstSeq   = "seamguard-first-seq"
	metaLastSeq    = "seamguard-last-seq"
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
	Backoff  time.Duration   // first retry delay, doubled each time; 0 means 200ms
	Verify   bool            // after the put, read the object back and check its digest
	// ChunkSize is the size of the object's chunks; 0 means
	// DefaultChunkSize, or half the server's largest message if that is
	// less.
	ChunkSize int
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
	if s.ChunkSize < 0 {
		errs = append(errs, fmt.Errorf("spill: Store.ChunkSize is %d; use 0 for the default of %d, or a positive size", s.ChunkSize, DefaultChunkSize))
	}
	if s.Backoff < 0 {
		errs = append(errs, fmt.Errorf("spill: Store.Backoff is %s; use 0 for the default of %s, or a positive duration", s.Backoff, DefaultBackoff))
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

// permanentError marks a failure that another attempt cannot cure.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return permanentError{err} }

func retryable(err error) bool {
	var p permanentError
	return !errors.Is(err, ErrIncomplete) && !errors.As(err, &p) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
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
	if len(p) == 0 {
		return nil
	}
	return permanent(fmt.Errorf("spill: bad spill request %q: %v", req.Name, p))
}

// Write writes the transcript req asks for into the bucket and returns its
// handle once the object is stored and its digest checked.
//
// The transcript is read from the events stream, from req.FirstSeq to
// req.LastSeq, and streamed into the object store: it is never held in
// memory whole. Which events belong to it is decided by replaying them
// through a shadow ledger, so the spill holds exactly the events the
// processor accepted. If the stream can no longer yield the whole
// transcript (events aged out, purged or deleted), Write returns an error
// wrapping ErrIncomplete at once. Object store failures are retried up to
// Retries times, Backoff apart (doubling); the last error is returned.
// Cancelling ctx stops Write promptly; nothing it started keeps running.
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
		wait *= 2
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
			return events.SpillHandle{}, fmt.Errorf("%w: events stream %s does not exist, so session %s's transcript cannot be read", ErrIncomplete, s.Stream, req.Session)
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

	// The transcript goes straight from the stream into chunks, each
	// published as it fills with at most putWindow awaiting their acks; the
	// info follows only once every chunk is stored. Whatever fails before
	// that purges the chunks sent, so the bucket never holds an info that
	// names missing chunks, nor chunks no info names.
	size := s.chunkSize()
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
			Opts: &jetstream.ObjectMetaOptions{ChunkSize: uint32(size)},
		},
		Bucket: s.Bucket,
		NUID:   nuid.Next(),
	}
	ow := newObjectWriter(ctx, s.JS, s.Bucket, info.NUID, size)
	w := &Writer{w: ow}
	err = s.produce(ctx, req, w)
	if err == nil {
		err = ow.close()
	}
	putErr := ow.err // the bucket's failure, which a write's error wraps
	if err == nil {
		info.Size, info.Chunks, info.Digest = ow.total, ow.chunks, ow.digest()
		putErr = s.putInfo(ctx, obs, info)
		err = putErr
	}
	if err != nil {
		ow.abandon()
		s.purgeChunks(ctx, ow.subject)
		if putErr != nil && ctx.Err() == nil {
			return events.SpillHandle{}, fmt.Errorf("spill: put %s into bucket %s: %w", req.Name, s.Bucket, putErr)
		}
		return events.SpillHandle{}, err
	}
	if info.Size != w.Size() {
		return events.SpillHandle{}, fmt.Errorf("%w: put %s stored %d bytes, but %d bytes were written",
			ErrDigestMismatch, req.Name, info.Size, w.Size())
	}
	if old != nil && !old.Deleted && old.NUID != info.NUID {
		s.purgeChunks(ctx, "$O."+s.Bucket+".C."+old.NUID)
	}
	stored, err := obs.GetInfo(ctx, req.Name)
	if err != nil {
		return events.SpillHandle{}, fmt.Errorf("spill: read back info of %s: %w", req.Name, err)
	}
	// Another writer of the same spill (an instance that lost the session
	// while it spilled) may have put it again since: the same name, size
	// and digest are the same transcript, and what the handle names.
	if stored.Digest != info.Digest || stored.Size != info.Size {
		return events.SpillHandle{}, fmt.Errorf("%w: bucket %s holds %s with %d bytes and digest %s, but %d bytes with digest %s were written (was it overwritten?)",
			ErrDigestMismatch, s.Bucket, req.Name, stored.Size, stored.Digest, info.Size, info.Digest)
	}
	if s.Verify {
		// stored is the version just put, and its digest is w's: reading
		// it back whole proves the bytes in the bucket are the ones written.
		if err := s.read(ctx, stored, io.Discard); err != nil {
			return events.SpillHandle{}, err
		}
	}
	return events.SpillHandle{
		Bucket:   s.Bucket,
		Name:     req.Name,
		Digest:   info.Digest,
		Size:     info.Size,
		Range:    req.Range,
		Events:   w.Events(),
		FirstSeq: req.FirstSeq,
		LastSeq:  req.LastSeq,
	}, nil
}

// checkEnds makes sure the transcript's first and last events are still in
// the stream before anything is read.
func (s *Store) checkEnds(ctx context.Context, str jetstream.Stream, req ledger.SpillRequest) error {
	subject := s.Subjects.Stored(req.Session)
	for _, end := range []struct {
		seq  uint64
		what string
	}{{req.FirstSeq, "first event (its session.opened)"}, {req.LastSeq, "last event (the compaction request)"}} {
		m, err := str.GetMsg(ctx, end.seq)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && s.behind(ctx, str, end.seq):
			return fmt.Errorf("%w: stream %s answered that it holds no sequence %d yet (a new leader still applying what it was sent?); session %s's transcript cannot be read now",
				ErrUnavailable, s.Stream, end.seq, req.Session)
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return fmt.Errorf("%w: session %s's %s at stream sequence %d is no longer in stream %s (aged out, purged or deleted); the transcript cannot be spilled whole",
				ErrIncomplete, req.Session, end.what, end.seq, s.Stream)
		case err != nil:
			return fmt.Errorf("spill: read stream %s at sequence %d: %w", s.Stream, end.seq, err)
		case m.Subject != subject:
			return fmt.Errorf("%w: stream %s holds %s at sequence %d, not session %s's %s",
				ErrIncomplete, s.Stream, m.Subject, end.seq, req.Session, end.what)
		}
	}
	return nil
}

// behind reports whether the stream's state ends before seq, or cannot be
// read: then a message not found at seq is no sign that it is gone, since
// the transcript's sequences were all delivered from this stream (a leader
// elected a moment ago may answer before it has applied its log).
func (s *Store) behind(ctx context.Context, str jetstream.Stream, seq uint64) bool {
	info, err := str.Info(ctx)
	return err != nil || info.State.LastSeq < seq
}

// produce reads the session's events from req.FirstSeq to req.LastSeq with
// an ordered consumer and writes the accepted ones to w.
func (s *Store) produce(ctx context.Context, req ledger.SpillRequest, w *Writer) error {
	cons, err := s.JS.OrderedConsumer(ctx, s.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{s.Subjects.Stored(req.Session)},
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       req.FirstSeq,
		InactiveThreshold: time.Minute,
		MaxResetAttempts:  3,
	})
	if err != nil {
		return fmt.Errorf("spill: read stream %s: %w", s.Stream, err)
	}
	defer s.dropConsumer(ctx, s.Stream, cons)
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return fmt.Errorf("%w: stream %s holds no event of session %s from sequence %d on (aged out or purged)",
			ErrIncomplete, s.Stream, req.Session, req.FirstSeq)
	}
	// At most 256 events buffered, and each pull asks for at most 1 MiB (or
	// the largest message, so that none stalls it), so a pull answers with a
	// few hundred KiB of small events, or one big one. (PullMaxBytes alone
	// would allocate a channel for a million messages.)
	pull := max(1<<20, int(s.JS.Conn().MaxPayload()))
	it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(256, pull))
	if err != nil {
		return fmt.Errorf("spill: read stream %s: %w", s.Stream, err)
	}
	defer it.Stop()

	var (
		shadow ledger.Ledger
		cfg    ledger.Config // acceptance does not depend on the policy
		last   uint64        // stream sequence of the last event read
		line   []byte        // each event's encoding, in one reused buffer
	)
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
		switch {
		case last == 0 && seq != req.FirstSeq:
			return fmt.Errorf("%w: session %s's first event at stream sequence %d is no longer in stream %s; its oldest remaining event is at %d",
				ErrIncomplete, req.Session, req.FirstSeq, s.Stream, seq)
		case seq > req.LastSeq:
			return fmt.Errorf("%w: session %s's compaction request at stream sequence %d is no longer in stream %s; the next event read is at %d",
				ErrIncomplete, req.Session, req.LastSeq, s.Stream, seq)
		}
		last = seq
		if err := s.apply(&shadow, cfg, msg, seq, w, &line); err != nil {
			return err
		}
		if seq < req.LastSeq && md.NumPending == 0 {
			// The consumer sees nothing more, but it may sit on a replica
			// that lags: only the stream's leader can say the end is gone.
			str, serr := s.JS.Stream(ctx, s.Stream)
			if serr == nil {
				serr = s.checkEnds(ctx, str, req)
			}
			if errors.Is(serr, ErrIncomplete) {
				return serr
			}
			return fmt.Errorf("%w: the reader of stream %s sees no event of session %s after sequence %d, but the transcript ends at %d and the stream still holds it",
				ErrUnavailable, s.Stream, req.Session, seq, req.LastSeq)
		}
	}
	// Checked before the last chunk goes out, so that no info is ever
	// written for a transcript with holes.
	if w.Events() != req.Events {
		return fmt.Errorf("%w: stream %s holds %d accepted events of session %s between sequences %d and %d, but the ledger counted %d: some were deleted",
			ErrIncomplete, s.Stream, w.Events(), req.Session, req.FirstSeq, req.LastSeq, req.Events)
	}
	return nil
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
	return nil, fmt.Errorf("spill: read stream %s: %w", s.Stream, err)
}

// apply replays one message through the shadow ledger and writes it if the
// processor accepted it.
func (s *Store) apply(shadow *ledger.Ledger, cfg ledger.Config, msg jetstream.Msg, seq uint64, w *Writer, buf *[]byte) error {
	// The message is read for this replay alone: the event may keep its
	// header and data.
	ev, err := events.DecodeMsgOwned(msg.Subject(), msg.Headers(), msg.Data(), s.Subjects)
	if err != nil {
		return nil // rejected by the processor too: not part of the transcript
	}
	ev.Meta.Seq = seq
	res, err := ledger.Step(shadow, ledger.Input{Event: ev}, cfg)
	if err != nil {
		return permanent(fmt.Errorf("spill: replay of stream sequence %d: %w", seq, err))
	}
	if res.Spill != nil {
		// The shadow only decides acceptance, which never depends on how
		// a spill went: answer every request it makes with a failure.
		if _, err := ledger.Step(shadow, ledger.Input{Spill: &ledger.SpillResult{Failure: "shadow"}}, cfg); err != nil {
			return permanent(fmt.Errorf("spill: replay of stream sequence %d: %w", seq, err))
		}
	}
	if !res.Accepted {
		return nil
	}
	line, err := events.AppendStructured((*buf)[:0], ev)
	if err != nil {
		return permanent(fmt.Errorf("spill: encode the event at stream sequence %d: %w", seq, err))
	}
	*buf = line
	return w.WriteLine(line) // fails only when the bucket refused a chunk
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
// Get reads the object's chunks with an ordered pull consumer that buffers
// at most 16 chunks, rather than with nats.go's ObjectStore.Get, whose push
// consumer lets up to 32 MB of chunks queue in the client, and which allows
// 5 seconds for the whole object when ctx has no deadline. Here ctx bounds
// the whole read and each chunk may take up to 10 seconds.
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
		stream := "OBJ_" + info.Bucket
		cons, err := s.JS.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			FilterSubjects:    []string{"$O." + info.Bucket + ".C." + info.NUID},
			InactiveThreshold: time.Minute,
			MaxResetAttempts:  3,
		})
		if err != nil {
			return fmt.Errorf("spill: read %s from bucket %s: %w", info.Name, info.Bucket, err)
		}
		defer s.dropConsumer(ctx, stream, cons)
		if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
			return mismatch("none of its %d chunks is in the bucket", info.Chunks)
		}
		chunk := 128 << 10
		if info.Opts != nil && info.Opts.ChunkSize > 0 {
			chunk = int(info.Opts.ChunkSize)
		}
		it, err := cons.Messages(jetstream.PullMaxMessagesWithBytesLimit(16, max(1<<20, 2*chunk)))
		if err != nil {
			return fmt.Errorf("spill: read %s from bucket %s: %w", info.Name, info.Bucket, err)
		}
		defer it.Stop()
		for chunks < info.Chunks {
			msg, err := nextWithin(ctx, it)
			if err != nil {
				return fmt.Errorf("spill: read %s from bucket %s after %d of %d chunks: %w", info.Name, info.Bucket, chunks, info.Chunks, err)
			}
			md, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("spill: read %s from bucket %s: %w", info.Name, info.Bucket, err)
			}
			data := msg.Data()
			h.Write(data)
			if _, err := w.Write(data); err != nil {
				return fmt.Errorf("spill: copy %s: %w", info.Name, err)
			}
			size += uint64(len(data))
			chunks++
			if chunks < info.Chunks && md.NumPending == 0 {
				return mismatch("the bucket holds only %d of its %d chunks", chunks, info.Chunks)
			}
		}
	}
	if got := jetstream.GetObjectDigestValue(h); got != info.Digest || size != info.Size {
		return mismatch("read back %d bytes in %d chunks with digest %s; its info says %d bytes in %d chunks with digest %s",
			size, chunks, got, info.Size, info.Chunks, info.Digest)
	}
	return nil
}

// nextWithin returns the next message, waiting at most readIdle.
func nextWithin(ctx context.Context, it jetstream.MessagesContext) (jetstream.Msg, error) {
	nctx, cancel := context.WithTimeout(ctx, readIdle)
	defer cancel()
	msg, err := it.Next(jetstream.NextContext(nctx))
	if err != nil && ctx.Err() == nil && nctx.Err() != nil {
		return nil, fmt.Errorf("nothing arrived within %s", readIdle)
	}
	return msg, err
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
	return events.SpillHandle{
		Bucket:   info.Bucket,
		Name:     info.Name,
		Digest:   info.Digest,
		Size:     info.Size,
		Range:    events.Range{Start: nums[0], End: nums[1]},
		Events:   nums[2],
		FirstSeq: nums[3],
		LastSeq:  nums[4],
	}, nil
}
