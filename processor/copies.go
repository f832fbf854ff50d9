package processor

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file holds what the processor knows of the session bucket's
// copies. A state read by direct get comes from any copy of the bucket;
// a replica may lag its leader, so on a replicated bucket a state just read
// may be older than the latest stored, and a session read fresh always
// catches up from the events stream (whose reads go to its leader), which
// makes an old state current before anything is decided on it. A bucket
// with one copy has no replica to lag: its reads are the latest state, and
// a session read fresh catches up only when an input of it may be pending
// past its stored sequence (see shard.handle), provided the servers sync
// every write before acknowledging it (Config.SyncAlways): a lazy server
// may lose a state it acknowledged, and the catch-up repairs that.

// copiesEvery is how often the processor reads the session bucket's
// replica count again, so that a bucket scaled up while it runs gets the
// replicated rule within that time.
const copiesEvery = 5 * time.Second

// latestReads reports whether a state read from the bucket is the latest
// one the bucket acknowledged, and stays so: one copy (no mirror serving
// its reads, as last read), on servers that sync before acknowledging.
func (p *Processor) latestReads() bool { return p.cfg.SyncAlways && p.oneCopy.Load() }

// readCopies reads the session bucket's configuration and records whether
// it has a single copy; on failure it assumes replicas.
func (p *Processor) readCopies(ctx context.Context) {
	ictx, cancel := context.WithTimeout(ctx, copiesEvery)
	defer cancel()
	st, err := p.res.Sessions.Status(ictx)
	if err != nil {
		p.oneCopy.Store(false)
		return
	}
	info, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		p.oneCopy.Store(false)
		return
	}
	cfg := info.StreamInfo().Config
	p.oneCopy.Store(cfg.Replicas <= 1 && !cfg.MirrorDirect && cfg.Mirror == nil)
}

// watchCopies reads the bucket's copies every copiesEvery until ctx ends.
func (p *Processor) watchCopies(ctx context.Context) {
	t := time.NewTicker(copiesEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.readCopies(ctx)
		}
	}
}
