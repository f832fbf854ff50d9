package spill

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// This file reads one spill a piece at a time, for a service that answers
// reads of a spill at an offset (the processor's recover service): each
// read is one direct get of the chunk holding the offset, found by the
// spill's chunk index (chunks.go), by a cursor a previous read returned, or
// by counting the chunks from the first.

// Reader reads the spills of one bucket a piece at a time. Make it with
// NewReader; its methods may be called from any number of goroutines.
type Reader struct {
	js     jetstream.JetStream
	bucket string
	obs    jetstream.ObjectStore

	mu  sync.Mutex
	str jetstream.Stream // the bucket's stream, opened on first use
}

// NewReader returns a Reader of bucket, whose object store obs is (as
// js.ObjectStore opens it).
func NewReader(js jetstream.JetStream, bucket string, obs jetstream.ObjectStore) *Reader {
	return &Reader{js: js, bucket: bucket, obs: obs}
}

func refused(kind ReadKind, format string, args ...any) error {
	return &ReadError{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

func failed(what string, err error) error {
	return &ReadError{Kind: ReadFailed, Msg: what, Err: err}
}

// Spill returns the info and the handle of the spill called name, which
// must be a spill Write wrote for session. Every error is a *ReadError:
// ReadNotFound, ReadNotSpill, ReadOtherSession or ReadFailed.
func (r *Reader) Spill(ctx context.Context, session, name string) (*jetstream.ObjectInfo, events.SpillHandle, error) {
	info, err := r.obs.GetInfo(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrObjectNotFound):
		return nil, events.SpillHandle{}, &ReadError{Kind: ReadNotFound, Err: err,
			Msg: fmt.Sprintf("session %s has no spill named %q in bucket %s", session, events.Excerpt(name), r.bucket)}
	case err != nil:
		return nil, events.SpillHandle{}, failed("read the info of "+name, err)
	case info.Opts != nil && info.Opts.Link != nil:
		return nil, events.SpillHandle{}, refused(ReadNotSpill, "%q in bucket %s is a link, not a spill", events.Excerpt(name), r.bucket)
	}
	h, err := HandleOf(info)
	if err != nil {
		return nil, events.SpillHandle{}, &ReadError{Kind: ReadNotSpill, Err: err,
			Msg: fmt.Sprintf("%q in bucket %s is not a spill seamguard wrote", events.Excerpt(name), r.bucket)}
	}
	if SessionOf(info) != session {
		return nil, events.SpillHandle{}, refused(ReadOtherSession, "%q is not a spill of session %s", events.Excerpt(name), session)
	}
	return info, h, nil
}

// A cursor says where the chunk holding a read's offset is: the object's
// version (its NUID: a name put again has another), the stream sequence
// at or after which that chunk is the first of the object's chunks, and
// the offset of the chunk's first byte in the object.
type cursor struct {
	nuid       string
	seq, start uint64
}

func (c cursor) String() string {
	return c.nuid + "." + strconv.FormatUint(c.seq, 10) + "." + strconv.FormatUint(c.start, 10)
}

func parseCursor(s string) (cursor, bool) {
	parts := strings.Split(s, ".")
	if len(parts) != 3 || parts[0] == "" {
		return cursor{}, false
	}
	seq, err1 := strconv.ParseUint(parts[1], 10, 64)
	start, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || seq == 0 {
		return cursor{}, false
	}
	return cursor{nuid: parts[0], seq: seq, start: start}, true
}

// startAt returns where a read of info at offset starts: at the cursor s,
// when given, else at the object's first chunk.
func startAt(info *jetstream.ObjectInfo, offset uint64, s string) (at cursor, given bool, err error) {
	if s == "" {
		return cursor{nuid: info.NUID, seq: 1}, false, nil
	}
	c, ok := parseCursor(s)
	switch {
	case !ok:
		return cursor{}, false, refused(ReadBadRequest, "cursor %q is not one this service gave: send back the %s header as it came, or no cursor", events.Excerpt(s), events.HeaderCursor)
	case c.nuid != info.NUID:
		return cursor{}, false, refused(ReadStale, "%s was written again since the cursor was given (it is the same spill when its size and digest are): read on without a cursor, or from the start", info.Name)
	case c.start > offset:
		return cursor{}, false, refused(ReadBadRequest, "the cursor points at a chunk starting at %d, after offset %d: send the offset the cursor came with", c.start, offset)
	}
	return c, true, nil
}

// ReadAt returns up to limit bytes (at least one) of the spill info
// describes (as Spill returned it) from offset, and the cursor of the
// next read: "" at the spill's end, else what to pass as cur with the
// offset after the bytes returned. cur is "" or a cursor ReadAt returned
// for offset; the cursor's format is "<nuid>.<seq>.<start>", and stays
// so, since services hand cursors to their clients.
//
// Chunks are read one at a time by direct get of the first message on the
// object's chunk subject at or after a sequence. With the spill's chunk
// index, or from a cursor, that is one read; otherwise the chunks are
// counted from the object's first, at most its chunk count of reads.
//
// Every error is a *ReadError: ReadBadRequest, ReadStale, ReadDamaged or
// ReadFailed.
func (r *Reader) ReadAt(ctx context.Context, info *jetstream.ObjectInfo, offset uint64, limit int, cur string) ([]byte, string, error) {
	if offset > info.Size {
		return nil, "", refused(ReadBadRequest, "offset %d is past the end of %s, which has %d bytes", offset, info.Name, info.Size)
	}
	if offset == info.Size {
		return nil, "", nil
	}
	at, given, err := startAt(info, offset, cur)
	if err != nil {
		return nil, "", err
	}
	str, err := r.stream(ctx)
	if err != nil {
		return nil, "", err
	}
	rd := chunkRead{str: str, info: info, offset: offset, limit: uint64(max(limit, 1)), subject: ChunkSubject(info.Bucket, info.NUID)}
	if idx, ok := ChunkIndexOf(info); ok && info.Opts != nil && info.Opts.ChunkSize > 0 {
		body, next, err := rd.indexed(ctx, idx, at, given)
		if !errors.Is(err, errNotIndexed) {
			return body, next, err
		}
		// The chunk is not where the index says (the object was written
		// again, or a chunk was replaced): read as without an index,
		// which finds the chunks wherever they are, and the caller's
		// digest check says whether they are the object's.
		at, given = cursor{nuid: info.NUID, seq: 1}, false
	}
	return rd.counted(ctx, at, given)
}

// chunkRead is one ReadAt: up to limit bytes of info from offset, its
// chunks on subject in str.
type chunkRead struct {
	str     jetstream.Stream
	info    *jetstream.ObjectInfo
	offset  uint64
	limit   uint64
	subject string
}

// counted reads from at on, one chunk a pass, at most the object's chunk
// count of them, until the chunk holding the offset.
func (rd *chunkRead) counted(ctx context.Context, at cursor, given bool) ([]byte, string, error) {
	info := rd.info
	for reads := uint32(0); ; reads++ {
		if reads >= info.Chunks {
			return nil, "", refused(ReadDamaged, "%s is damaged: its %d chunks end before its %d bytes", info.Name, info.Chunks, info.Size)
		}
		m, err := rd.str.GetMsg(ctx, at.seq, jetstream.WithGetMsgSubject(rd.subject))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) && given:
			return nil, "", refused(ReadBadRequest, "the cursor points past the chunks of %s: send back the %s header as it came, or no cursor", info.Name, events.HeaderCursor)
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, "", refused(ReadDamaged, "%s is damaged: bucket %s holds no chunk of it after byte %d of %d", info.Name, info.Bucket, at.start, info.Size)
		case err != nil:
			return nil, "", failed("read a chunk of "+info.Name, err)
		}
		n := uint64(len(m.Data))
		if rd.offset >= at.start+n {
			if given && reads == 0 {
				return nil, "", refused(ReadBadRequest, "the cursor points at a chunk that ends before offset %d: send the offset the cursor came with", rd.offset)
			}
			at = cursor{nuid: info.NUID, seq: m.Sequence + 1, start: at.start + n}
			continue
		}
		skip := rd.offset - at.start
		end := min(n, skip+rd.limit)
		if at.start+end > info.Size {
			return nil, "", refused(ReadDamaged, "%s is damaged: its chunks hold more than its %d bytes", info.Name, info.Size)
		}
		next := cursor{nuid: info.NUID, seq: m.Sequence, start: at.start}
		if end == n {
			next = cursor{nuid: info.NUID, seq: m.Sequence + 1, start: at.start + n}
		}
		if at.start+end == info.Size {
			return m.Data[skip:end], "", nil
		}
		return m.Data[skip:end], next.String(), nil
	}
}

// indexed reads for a spill whose writer recorded where its chunks are
// (ChunkIndex): the chunk holding the offset is read by its sequence, one
// read whatever the offset. A cursor, when given, must be one ReadAt
// returned for the spill: the start and sequence of a chunk.
func (rd *chunkRead) indexed(ctx context.Context, idx ChunkIndex, at cursor, given bool) ([]byte, string, error) {
	info := rd.info
	size := uint64(info.Opts.ChunkSize)
	k := rd.offset / size
	if given {
		if want, ok := idx.Seq(uint32(at.start / size)); !ok || at.start%size != 0 || want != at.seq {
			return nil, "", refused(ReadBadRequest, "the cursor does not point at a chunk of %s: send back the %s header as it came, or no cursor", info.Name, events.HeaderCursor)
		}
		if at.start+size <= rd.offset {
			return nil, "", refused(ReadBadRequest, "the cursor points at a chunk that ends before offset %d: send the offset the cursor came with", rd.offset)
		}
	}
	seq, ok := idx.Seq(uint32(k))
	if k > uint64(^uint32(0)) || !ok {
		return nil, "", refused(ReadDamaged, "%s is damaged: its %d chunks end before its %d bytes", info.Name, info.Chunks, info.Size)
	}
	m, err := rd.str.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, "", errNotIndexed
	case err != nil:
		return nil, "", failed("read a chunk of "+info.Name, err)
	case m.Subject != rd.subject:
		return nil, "", errNotIndexed
	}
	start := k * size
	n := uint64(len(m.Data))
	if n == 0 || (n != size && start+n != info.Size) || start+n > info.Size {
		return nil, "", refused(ReadDamaged, "%s is damaged: chunk %d has %d bytes, in an object of %d bytes in chunks of %d", info.Name, k, n, info.Size, size)
	}
	skip := rd.offset - start
	end := min(n, skip+rd.limit)
	if start+end == info.Size {
		return m.Data[skip:end], "", nil
	}
	next := cursor{nuid: info.NUID, seq: seq, start: start}
	if end == n {
		nseq, _ := idx.Seq(uint32(k + 1))
		next = cursor{nuid: info.NUID, seq: nseq, start: start + n}
	}
	return m.Data[skip:end], next.String(), nil
}

// errNotIndexed: a chunk is not at the sequence its object's index says.
var errNotIndexed = errors.New("spill: the chunk is not where the spill's index says")

// stream returns the bucket's stream, opening it on first use.
func (r *Reader) stream(ctx context.Context) (jetstream.Stream, error) {
	r.mu.Lock()
	str := r.str
	r.mu.Unlock()
	if str != nil {
		return str, nil
	}
	str, err := r.js.Stream(ctx, StreamName(r.bucket))
	if err != nil {
		return nil, failed("open the stream of bucket "+r.bucket, err)
	}
	r.mu.Lock()
	r.str = str
	r.mu.Unlock()
	return str, nil
}
