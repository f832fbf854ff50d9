package spill

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// The chunk index: where in the bucket's stream each chunk of a spill is.
//
// The object store finds an object's chunks by reading its chunk subject
// from the start, so reaching the chunk that holds byte n costs a read of
// every chunk before it. A spill's writer knows the stream sequence of
// every chunk from its ack, and records them in the object's info as runs
// of consecutive sequences ("first+count", comma-separated; chunks of one
// spill are consecutive unless another spill's chunks interleave). A reader
// that wants byte n then reads chunk n/ChunkSize by its sequence alone.
// An info without the index (another writer's, or an index that would have
// been longer than maxIndexRuns) is read chunk by chunk as before.

// metaChunkSeqs is the info's metadata key of the chunk index.
const metaChunkSeqs = "seamguard-chunk-seqs"

// maxIndexRuns bounds the runs an index records: an object whose chunks
// are scattered over more runs than this gets no index, so that its info
// stays small.
const maxIndexRuns = 1024

// seqRun is count consecutive stream sequences from first.
type seqRun struct {
	first uint64
	count uint32
}

// seqRuns collects chunk sequences, in increasing order, as runs.
type seqRuns []seqRun

// add records the next chunk's sequence, which must be above the last.
func (r *seqRuns) add(seq uint64) {
	if n := len(*r); n > 0 {
		last := &(*r)[n-1]
		if last.first+uint64(last.count) == seq {
			last.count++
			return
		}
	}
	*r = append(*r, seqRun{first: seq, count: 1})
}

// String is the index as stored: "" when there are too many runs.
func (r seqRuns) String() string {
	if len(r) == 0 || len(r) > maxIndexRuns {
		return ""
	}
	var b strings.Builder
	for i, run := range r {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(run.first, 10))
		b.WriteByte('+')
		b.WriteString(strconv.FormatUint(uint64(run.count), 10))
	}
	return b.String()
}

// parseSeqRuns reads an index that must describe exactly chunks chunks in
// increasing sequence order; ok is false for anything else.
func parseSeqRuns(s string, chunks uint32) (seqRuns, bool) {
	if s == "" {
		return nil, false
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxIndexRuns {
		return nil, false
	}
	runs := make(seqRuns, 0, len(parts))
	var total uint64
	var next uint64 = 1
	for _, p := range parts {
		a, b, ok := strings.Cut(p, "+")
		if !ok {
			return nil, false
		}
		first, err1 := strconv.ParseUint(a, 10, 64)
		count, err2 := strconv.ParseUint(b, 10, 32)
		if err1 != nil || err2 != nil || count == 0 || first < next || (len(runs) > 0 && first == next) || first+count < first {
			return nil, false
		}
		runs = append(runs, seqRun{first: first, count: uint32(count)})
		next = first + count
		total += count
	}
	// Only the form the writer stores: no leading zeros, no runs that
	// continue each other.
	if total != uint64(chunks) || runs.String() != s {
		return nil, false
	}
	return runs, true
}

// ChunkIndex is the recorded position of every chunk of one object. Its
// zero value knows none.
type ChunkIndex struct {
	runs seqRuns
}

// ChunkIndexOf returns the chunk index the writer recorded in info, and
// false when it recorded none (or one that does not fit info's chunks).
func ChunkIndexOf(info *jetstream.ObjectInfo) (ChunkIndex, bool) {
	if info == nil {
		return ChunkIndex{}, false
	}
	runs, ok := parseSeqRuns(info.Metadata[metaChunkSeqs], info.Chunks)
	return ChunkIndex{runs: runs}, ok
}

// Seq returns the stream sequence of chunk k (from 0), and false past the
// last chunk.
func (x ChunkIndex) Seq(k uint32) (uint64, bool) {
	for _, run := range x.runs {
		if k < run.count {
			return run.first + uint64(k), true
		}
		k -= run.count
	}
	return 0, false
}
