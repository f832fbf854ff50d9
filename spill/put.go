package spill

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultChunkSize is the size of the chunks Write stores a spill in when
// Store.ChunkSize is 0 (at most half the server's largest message).
// nats.go's own Put uses 128 KiB; a quarter as many chunks costs the server
// a quarter of the per-message work (see the README's performance section).
const DefaultChunkSize = 512 << 10

// putWindow is how many chunks of one spill may wait for their acks at
// once: it bounds the client's memory to (putWindow+1) chunks whatever the
// transcript's size, and keeps the server busy meanwhile.
const putWindow = 8

// ackWait bounds the wait for the ack of one chunk or of the object's info.
const ackWait = 10 * time.Second

// objectWriter writes an object's bytes into its bucket's stream as chunks
// of a fixed size, the layout of the JetStream object store (the chunks on
// $O.<bucket>.C.<nuid>, the info on $O.<bucket>.M.<name>), publishing each
// chunk as it fills and hashing what it sends. It never publishes the info:
// the caller does that once close has every chunk's ack, so that no info
// ever names a chunk the stream does not hold. Not safe for concurrent use.
type objectWriter struct {
	ctx     context.Context
	js      jetstream.JetStream
	stream  string // OBJ_<bucket>
	subject string // $O.<bucket>.C.<nuid>
	size    int

	buf    []byte   // the chunk being filled
	spare  [][]byte // chunk buffers whose publish is acknowledged
	flight []inFlight
	h      hash.Hash
	total  uint64
	chunks uint32
	err    error // the first failure; every later call returns it
}

// inFlight is a chunk sent and not yet acknowledged.
type inFlight struct {
	f   jetstream.PubAckFuture
	buf []byte // reused only once f says the chunk is stored
}

func newObjectWriter(ctx context.Context, js jetstream.JetStream, bucket, nuid string, size int) *objectWriter {
	return &objectWriter{
		ctx: ctx, js: js, stream: "OBJ_" + bucket, subject: "$O." + bucket + ".C." + nuid, size: size,
		buf: make([]byte, 0, size), h: sha256.New(),
	}
}

// Write copies p into chunks, sending each one that fills.
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

// send publishes the chunk in buf, first waiting for acks while putWindow
// chunks are in flight.
func (o *objectWriter) send() error {
	if len(o.buf) == 0 {
		return nil
	}
	if err := o.ctx.Err(); err != nil {
		return err
	}
	for len(o.flight) >= putWindow {
		if err := o.settle(); err != nil {
			return err
		}
	}
	o.h.Write(o.buf)
	msg := &nats.Msg{Subject: o.subject, Data: o.buf}
	f, err := o.js.PublishMsgAsync(msg, jetstream.WithExpectStream(o.stream))
	if err != nil {
		return fmt.Errorf("spill: send chunk %d to %s: %w", o.chunks+1, o.stream, err)
	}
	o.flight = append(o.flight, inFlight{f: f, buf: o.buf})
	o.total += uint64(len(o.buf))
	o.chunks++
	if n := len(o.spare); n > 0 {
		o.buf, o.spare = o.spare[n-1][:0], o.spare[:n-1]
	} else {
		o.buf = make([]byte, 0, o.size)
	}
	return nil
}

// settle waits for the ack of the oldest chunk in flight.
func (o *objectWriter) settle() error {
	c := o.flight[0]
	t := time.NewTimer(ackWait)
	defer t.Stop()
	select {
	case <-c.f.Ok():
	case err := <-c.f.Err():
		return fmt.Errorf("spill: store a chunk in %s: %w", o.stream, err)
	case <-t.C:
		return fmt.Errorf("spill: store a chunk in %s: no ack within %s: %w", o.stream, ackWait, nats.ErrTimeout)
	case <-o.ctx.Done():
		return o.ctx.Err()
	}
	o.flight = append(o.flight[:0], o.flight[1:]...)
	o.spare = append(o.spare, c.buf)
	return nil
}

// close sends the last chunk and waits until every chunk is stored.
func (o *objectWriter) close() error {
	if o.err == nil {
		o.err = o.send()
	}
	for o.err == nil && len(o.flight) > 0 {
		o.err = o.settle()
	}
	return o.err
}

// abandon waits, for ackWait at most, until the chunks in flight are
// answered, so that a purge after a failure finds every chunk that will
// ever land.
func (o *objectWriter) abandon() {
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
	msg := nats.NewMsg("$O." + s.Bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(info.Name)))
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Data = data
	pctx, cancel := context.WithTimeout(ctx, ackWait)
	_, err = s.JS.PublishMsg(pctx, msg, jetstream.WithExpectStream("OBJ_"+s.Bucket))
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
	str, err := s.JS.Stream(pctx, "OBJ_"+s.Bucket)
	if err == nil {
		_ = str.Purge(pctx, jetstream.WithPurgeSubject(subject))
	}
}
