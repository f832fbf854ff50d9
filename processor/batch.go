package processor

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seamguard/seamguard/internal/jsfail"
)

// This file holds atomic batches: the writes of one shard batch to one
// stream (its verdicts, then its sessions' states) go to the server as one
// atomic batch (JetStream's Nats-Batch-Id, Nats-Batch-Sequence and
// Nats-Batch-Commit headers), which a server that syncs every write stores
// with one fsync for the whole batch instead of one per message. The batch
// is all or nothing: every compare-and-swap and dedupe check in it passes
// and every message is stored, or none is. Whatever does not plainly commit
// (a conflict, a duplicate verdict id, a lost reply, a stream that does not
// allow atomic batches) is written again one message at a time, which sorts
// out each message on its own as before: batching changes how many fsyncs
// the writes cost, never what is written or when an input is acknowledged.

// Atomic batch headers, as nats-server reads them.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// maxAtomicBatch is the most messages one atomic batch holds: nats-server's
// default limit (max_batch_size). Longer runs of writes go in several.
const maxAtomicBatch = 1000

// minAtomicBatch is the fewest writes worth an atomic batch. A batch costs
// the server a staging store besides its fsync (on a single server, a
// store of its own, synced once), several fsyncs' worth in all, so a few
// writes are cheaper sent one by one, pipelined; from about ten on, the
// batch is. Fewer writes than this go one at a time.
const minAtomicBatch = 16

// batchError is a batch the server refused: its error code and text.
type batchError struct {
	code int
	desc string
}

func (e *batchError) Error() string {
	return fmt.Sprintf("atomic batch refused: %s (JetStream error %d)", e.desc, e.code)
}

// batcher writes atomic batches to the streams that allow them. A stream
// that refuses them as disabled is written one message at a time from then
// on (and a warning logged once).
type batcher struct {
	p *Processor
	// off is set per stream kind once its stream said atomic batches are
	// disabled, or from the start with Config.NoAtomicBatches.
	offVerdicts, offStates atomic.Bool
	// Counters (Stats): batches committed, the messages they held, and
	// batches that did not commit and were written one by one.
	committed, messages, fellBack atomic.Uint64
}

// on reports whether writes of kind (verdicts or states) go in batches.
func (bt *batcher) on(states bool) bool {
	if bt.p.cfg.NoAtomicBatches {
		return false
	}
	if states {
		return !bt.offStates.Load()
	}
	return !bt.offVerdicts.Load()
}

// write publishes msgs to one stream as atomic batches of at most
// maxAtomicBatch messages, in order, and returns the stream sequence of
// each message. The caller's messages are not changed. On an error, the
// batches before the failing one are committed (firsts says how many
// messages they held) and nothing after them is.
func (bt *batcher) write(ctx context.Context, states bool, msgs []*nats.Msg) (seqs []uint64, err error) {
	seqs = make([]uint64, 0, len(msgs))
	for len(msgs) > 0 {
		n := min(len(msgs), maxAtomicBatch)
		first, err := bt.commit(ctx, msgs[:n])
		if errors.Is(err, errAtomicDisabled) {
			off := &bt.offVerdicts
			if states {
				off = &bt.offStates
			}
			if !off.Swap(true) {
				bt.p.log.Warn("a stream does not allow atomic batches: writing its messages one at a time (Provision turns them on)", "subject", msgs[0].Subject)
			}
		}
		if err != nil {
			bt.fellBack.Add(1)
			return seqs, err
		}
		for i := range n {
			seqs = append(seqs, first+uint64(i))
		}
		bt.committed.Add(1)
		bt.messages.Add(uint64(n))
		msgs = msgs[n:]
	}
	return seqs, nil
}

// commit sends one atomic batch and returns the stream sequence of its
// first message. Every message but the last goes without a reply subject
// (nothing waits for it); the last carries the commit and is a request
// whose answer is the batch's publish ack. A message the server could not
// stage leaves a gap it reports at the commit.
func (bt *batcher) commit(ctx context.Context, msgs []*nats.Msg) (uint64, error) {
	nc := bt.p.js.Conn()
	id := newBatchID()
	for i, m := range msgs {
		out := nats.NewMsg(m.Subject)
		out.Data = m.Data
		for k, v := range m.Header {
			out.Header[k] = v
		}
		out.Header.Set(batchIDHeader, id)
		out.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i < len(msgs)-1 {
			if err := nc.PublishMsg(out); err != nil {
				return 0, fmt.Errorf("processor: atomic batch of %d: %w", len(msgs), err)
			}
			continue
		}
		out.Header.Set(batchCommitHeader, "1")
		rctx, cancel := context.WithTimeout(ctx, pubAckWait)
		reply, err := nc.RequestMsgWithContext(rctx, out)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("processor: atomic batch of %d: %w", len(msgs), err)
		}
		return parseBatchAck(reply.Data, len(msgs))
	}
	return 0, errors.New("processor: empty atomic batch")
}

// parseBatchAck reads a batch commit's publish ack: the sequence of the
// batch's first message, or the server's refusal.
func parseBatchAck(data []byte, n int) (uint64, error) {
	var ack struct {
		Seq   uint64 `json:"seq"`
		Count uint64 `json:"count"`
		Error *struct {
			Code        int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &ack); err != nil {
		return 0, fmt.Errorf("processor: atomic batch: unreadable publish ack %q: %w", data, err)
	}
	if ack.Error != nil {
		if jetstream.ErrorCode(ack.Error.Code) == jsfail.CodeAtomicPublishDisabled {
			return 0, fmt.Errorf("%w: %s", errAtomicDisabled, ack.Error.Description)
		}
		return 0, &batchError{code: ack.Error.Code, desc: ack.Error.Description}
	}
	if ack.Count == 0 {
		// A server that does not know atomic batches stored the commit
		// as a message of its own.
		return 0, fmt.Errorf("%w: the publish ack names no batch", errAtomicDisabled)
	}
	if ack.Count != uint64(n) || ack.Seq < uint64(n) {
		return 0, fmt.Errorf("processor: atomic batch of %d: the server acknowledged %d messages up to sequence %d", n, ack.Count, ack.Seq)
	}
	return ack.Seq - uint64(n) + 1, nil
}

// newBatchID returns a random batch id (22 characters; the server takes at
// most 64).
func newBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}
