package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/seamguard/seamguard/internal/jsfail"
)

// This file holds the watch over the streams behind the processor's
// stores: a store deleted under a running processor (an operator's
// mistake, a restore gone wrong) makes it unready, naming the store, until
// the store is back. The processor never recreates a store itself: an
// empty verdict stream, session bucket or spill store put in place of a
// lost one would hide the loss.

// storeCheckEvery is how often the processor asks the server whether each
// store's stream still exists. A failure that may mean a store is gone
// asks again at once, at most every storeCheckMinGap.
const (
	storeCheckEvery  = 2 * time.Second
	storeCheckMinGap = 500 * time.Millisecond
)

// storePrefix starts the trouble key of a missing store.
const storePrefix = "store "

// watchedStore is one store whose stream is watched.
type watchedStore struct {
	stream string // the JetStream stream behind it
	what   string // how an operator knows it
	fix    string // what an operator can do
}

// stores lists what the processor needs, in the order it is checked.
func (p *Processor) stores() []watchedStore {
	n := p.cfg.Names()
	wait := "; decisions wait, their inputs unacknowledged, until it is back"
	return []watchedStore{
		{n.Events, "the events stream " + n.Events,
			"restore it from a backup, then restart seamguard serve, which creates its consumers again; do not let serve create it empty while the session bucket holds states, since its sequence numbers would start again (see Readiness in docs/operating.md)"},
		{n.Verdicts, "the verdict stream " + n.Verdicts,
			"restore it from a backup, or restart seamguard serve --rebuild, which creates it again and republishes the verdicts of every input the events stream still holds" + wait},
		{n.SessionsStream(), "the session bucket " + n.Sessions + " (stream " + n.SessionsStream() + ")",
			"restart seamguard serve, which creates it again empty (each session is caught up from the events stream before its next decision), or restore it from a backup" + wait},
		{n.SpillsStream(), "the spill object store " + n.Spills + " (stream " + n.SpillsStream() + ")",
			"restore it from a backup, or restart seamguard serve, which creates it again empty (the spills it held are lost); compactions that need a spill wait, their inputs unacknowledged, until it is back"},
		{n.LeasesStream(), "the leases bucket " + n.Leases + " (stream " + n.LeasesStream() + ")",
			"restart seamguard serve, which creates it again (it holds nothing that outlives the lease TTL); until then no partition lease can be renewed or taken"},
	}
}

// watchStores checks every store now, every storeCheckEvery, and whenever
// a failure asks for it (see noticeFailure), until ctx ends.
func (p *Processor) watchStores(ctx context.Context) {
	t := time.NewTicker(storeCheckEvery)
	defer t.Stop()
	for {
		p.checkStores(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.checkNow:
			if sleep(ctx, storeCheckMinGap) != nil {
				return
			}
		}
	}
}

// checkStores asks the server for each store's stream. A store the server
// says does not exist is a trouble until it does again; a server that does
// not answer changes nothing here (the connection's state and the
// failures it causes report it).
func (p *Processor) checkStores(ctx context.Context) {
	for _, s := range p.stores() {
		cctx, cancel := context.WithTimeout(ctx, infoWait)
		_, err := p.js.Stream(cctx, s.stream)
		cancel()
		if ctx.Err() != nil {
			return
		}
		key := storePrefix + s.stream
		switch {
		case err == nil:
			if p.health.clear(key) {
				p.obs.StoreMissing(s.stream, false)
				p.log.Info("store back", "store", s.what)
			}
		case storeMissing(err):
			if p.health.set(key, fmt.Errorf("%w: %s does not exist: %s", ErrStoreMissing, s.what, s.fix)) {
				p.obs.StoreMissing(s.stream, true)
				p.log.Error("store missing: the processor is unready until it is back", "store", s.what, "what_to_do", s.fix)
			}
		}
	}
}

// storeGone reports whether the last check found the stream missing.
func (p *Processor) storeGone(stream string) bool { return p.health.has(storePrefix + stream) }

// noticeFailure asks for a check of the stores now when err may mean that
// one is gone: the server says a stream does not exist, or nothing
// answered a publish to a stream's subject. It never blocks.
func (p *Processor) noticeFailure(err error) {
	if err == nil || p.checkNow == nil {
		return
	}
	if storeMissing(err) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		select {
		case p.checkNow <- struct{}{}:
		default:
		}
	}
}

// storeMissing reports whether err says that a stream, bucket or object
// store does not exist.
func storeMissing(err error) bool { return jsfail.StreamMissing(err) }
