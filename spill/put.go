package spill

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultChunkSize is the size of the chunks Write stores a spill in when
// Store.ChunkSize is 0 (at most half the server's largest message).
// nats.go's own Put uses 128 KiB; a quarter as many chunks costs the server
// a quarter of the per-message work (see docs/performance.md).
const DefaultChunkSize = 512 << 10

// putWindow is how many chunks of one spill may wait for their acks at
// once: it bounds the client's memory to (putWindow+1) chunks whatever the
// transcript's size, and keeps the server busy meanwhile.
const putWindow = 8

// ackWait bounds the wait for the ack of one chunk or of the object's info.
const ackWait = 10 * time.Second

// objectWriter writes an object's bytes into its bucket's stream as chunks
// of a fixed size, the layout of the JetStream object store (the chunks on
// $O.<bucket>.C.<nuid>, the info on $O.<bucket>.M.<name>). The caller fills
// chunks; a goroutine of the writer hashes and publishes each full one, with
// at most putWindow awaiting their acks, so that hashing and sending overlap
// with reading the next events. It never publishes the info: the caller
// does that once close has every chunk's ack, so that no info ever names a
// chunk the stream does not hold. Write, WriteByte, close and abandon are
// called from one goroutine.
type objectWriter struct {
	ctx     context.Context
	js      jetstream.JetStream
	stream  string // OBJ_<bucket>
	subject string // $O.<bucket>.C.<nuid>
	size    int

	buf    []byte        // the chunk being filled
	made   int           // chunk buffers allocated
	full   chan []byte   // filled chunks, for the sender
	free   chan []byte   // buffers the sender is done with
	done   chan struct{} // closed when the sender has ended
	closed bool          // full is closed
	err    error         // the first failure seen here

	mu      sync.Mutex
	sendErr error // the sender's first failure

	// The sender's; read once done is closed.
	h       hash.Hash
	total   uint64
	chunks  uint32
	flight  []inFlight
	lastSeq uint64  // the stream sequence of the last chunk acknowledged
	seqs    seqRuns // every acknowledged chunk's sequence (chunks.go)
}

// errChunkOrder means a chunk was stored before one sent ahead of it: the
// object would read back out of order. Another attempt may succeed.
var errChunkOrder = errors.New("chunks stored out of order")

// inFlight is a chunk sent and not yet acknowledged.
type inFlight struct {
	f   jetstream.PubAckFuture
	buf []byte // reused only once f says the chunk is stored
}

// maxChunks bounds the chunk buffers of one writer: those in flight, one
// being sent, one queued and one being filled.
const maxChunks = putWindow + 3

func newObjectWriter(ctx context.Context, js jetstream.JetStream, bucket, nuid string, size int) *objectWriter {
	o := &objectWriter{
		ctx: ctx, js: js, stream: StreamName(bucket), subject: ChunkSubject(bucket, nuid), size: size,
		buf: make([]byte, 0, size), made: 1, h: sha256.New(),
		full: make(chan []byte, 1), free: make(chan []byte, maxChunks), done: make(chan struct{}),
	}
	go o.sender()
	return o
}

// Write copies p into chunks, handing each one that fills to the sender.
func (o *objectWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 && o.err == nil {
		c := copy(o.buf[len(o.buf):cap(o.buf)], p)
		o.buf = o.buf[:len(o.buf)+c]
		p, n = p[c:], n+c
		if len(o.buf) == cap(o.buf) {
			o.err = o.send()
		}
	}
	return n, o.err
}

// WriteByte appends one byte.
func (o *objectWriter) WriteByte(c byte) error {
	if o.err != nil {
		return o.err
	}
	o.buf = append(o.buf, c)
	if len(o.buf) == cap(o.buf) {
		o.err = o.send()
	}
	return o.err
}

// Flush reports the first failure: chunks go out as they fill, and close
// sends the last, short one.
func (o *objectWriter) Flush() error { return o.err }

// send hands the chunk in buf to the sender and takes an empty buffer,
// waiting while every buffer is in use.
func (o *objectWriter) send() error {
	if len(o.buf) == 0 {
		return nil
	}
	if err := o.failed(); err != nil {
		return err
	}
	if err := o.ctx.Err(); err != nil {
		return err
	}
	select {
	case o.full <- o.buf:
	case <-o.done:
		return o.failed()
	}
	select {
	case b := <-o.free:
		o.buf = b[:0]
		return nil
	default:
	}
	if o.made < maxChunks {
		o.made++
		o.buf = make([]byte, 0, o.size)
		return nil
	}
	select {
	case b := <-o.free:
		o.buf = b[:0]
		return nil
	case <-o.done:
		o.buf = nil
		return o.failed()
	}
}

// failed returns the sender's first failure.
func (o *objectWriter) failed() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.sendErr
}

func (o *objectWriter) fail(err error) {
	o.mu.Lock()
	if o.sendErr == nil {
		o.sendErr = err
	}
	o.mu.Unlock()
}

// sender hashes and publishes the chunks in order until full is closed or
// a chunk fails; then it waits for the acks of those in flight, unless one
// failed (abandon waits for them then).
func (o *objectWriter) sender() {
	defer close(o.done)
	for b := range o.full {
		for len(o.flight) >= putWindow && o.failed() == nil {
			if err := o.settle(); err != nil {
				o.fail(err)
			}
		}
		if err := o.ctx.Err(); err != nil {
			o.fail(err)
		}
		if o.failed() != nil {
			return
		}
		o.h.Write(b)
		msg := &nats.Msg{Subject: o.subject, Data: b}
		// No retry inside the client: it republishes a chunk the server
		// answered "no responders" after the chunks sent behind it, which
		// would store the object out of order. A failed chunk fails the
		// put instead, and the caller's retry writes the object again.
		f, err := o.js.PublishMsgAsync(msg, jetstream.WithExpectStream(o.stream), jetstream.WithRetryAttempts(0))
		if err != nil {
			o.fail(fmt.Errorf("spill: send chunk %d to %s: %w", o.chunks+1, o.stream, err))
			return
		}
		o.flight = append(o.flight, inFlight{f: f, buf: b})
		o.total += uint64(len(b))
		o.chunks++
	}
	for len(o.flight) > 0 && o.failed() == nil {
		if err := o.settle(); err != nil {
			o.fail(err)
		}
	}
}

// settle waits for the ack of the oldest chunk in flight.
func (o *objectWriter) settle() error {
	c := o.flight[0]
	t := time.NewTimer(ackWait)
	defer t.Stop()
	select {
	case ack := <-c.f.Ok():
		// The object store reads chunks in stream order: each must be
		// stored after the one before it.
		if ack.Sequence <= o.lastSeq {
			o.flight = append(o.flight[:0], o.flight[1:]...)
			return fmt.Errorf("spill: chunk stored in %s at sequence %d, not after the chunk before it (%d): %w", o.stream, ack.Sequence, o.lastSeq, errChunkOrder)
		}
		o.lastSeq = ack.Sequence
		o.seqs.add(ack.Sequence)
	case err := <-c.f.Err():
		// Answered: abandon must not wait for it again.
		o.flight = append(o.flight[:0], o.flight[1:]...)
		return fmt.Errorf("spill: store a chunk in %s: %w", o.stream, err)
	case <-t.C:
		return fmt.Errorf("spill: store a chunk in %s: no ack within %s: %w", o.stream, ackWait, nats.ErrTimeout)
	case <-o.ctx.Done():
		return o.ctx.Err()
	}
	o.flight = append(o.flight[:0], o.flight[1:]...)
	o.free <- c.buf // never blocks: free holds every buffer there is
	return nil
}

// close sends the last chunk and waits until every chunk is stored.
func (o *objectWriter) close() error {
	if o.err == nil {
		o.err = o.send()
	}
	o.stop()
	if o.err == nil {
		o.err = o.failed()
	}
	return o.err
}

// stop ends the sender and waits for it.
func (o *objectWriter) stop() {
	if !o.closed {
		o.closed = true
		close(o.full)
	}
	<-o.done
}

// abandon ends the sender and waits, for ackWait at most, until the chunks
// still in flight are answered, so that a purge after a failure finds
// every chunk that will ever land.
func (o *objectWriter) abandon() {
	o.fail(errAbandoned)
	o.stop()
	t := time.NewTimer(ackWait)
	defer t.Stop()
	for _, c := range o.flight {
		select {
		case <-c.f.Ok():
		case <-c.f.Err():
		case <-t.C:
			return
		}
	}
	o.flight = nil
}

var errAbandoned = errors.New("spill: the put was abandoned")

// digest is the object store digest of everything sent.
func (o *objectWriter) digest() string { return jetstream.GetObjectDigestValue(o.h) }

// putInfo publishes the object's info, replacing whatever the name held,
// once all its chunks are stored. When the answer is lost it reads the
// info back: stored means done.
func (s *Store) putInfo(ctx context.Context, obs jetstream.ObjectStore, info *jetstream.ObjectInfo) error {
	data, err := json.Marshal(info)
	if err != nil {
		return permanent(fmt.Errorf("spill: encode the info of %s: %w", info.Name, err))
	}
	msg := nats.NewMsg(MetaSubject(s.Bucket, info.Name))
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Data = data
	pctx, cancel := context.WithTimeout(ctx, ackWait)
	_, err = s.JS.PublishMsg(pctx, msg, jetstream.WithExpectStream(StreamName(s.Bucket)))
	cancel()
	if err == nil {
		return nil
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		// No answer: it may have been stored all the same.
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackWait)
		stored, gerr := obs.GetInfo(gctx, info.Name)
		cancel()
		if gerr == nil && stored.NUID == info.NUID {
			return nil
		}
	}
	return fmt.Errorf("spill: store the info of %s in bucket %s: %w", info.Name, s.Bucket, err)
}

// purgeChunks removes the chunks on subject, with a context of its own:
// Write's may have ended, which is why they are left over.
func (s *Store) purgeChunks(ctx context.Context, subject string) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackWait)
	defer cancel()
	str, err := s.JS.Stream(pctx, StreamName(s.Bucket))
	if err == nil {
		_ = str.Purge(pctx, jetstream.WithPurgeSubject(subject))
	}
}
