package spill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A write in progress registers itself in the bucket, so that SweepOrphans
// can tell its chunks from a dead writer's.
const (
	// DefaultRenewal is how often a write renews its registration.
	DefaultRenewal = 5 * time.Second
	// DefaultRegistrationTTL is how long a registration lasts unrenewed:
	// SweepOrphans takes an older one for a dead writer's, and a writer
	// that could not renew its own for half of it gives its attempt up
	// before it stores the info.
	DefaultRegistrationTTL = 60 * time.Second
)

// sweepWait bounds each request of a sweep to the bucket.
const sweepWait = 30 * time.Second

func (s *Store) renewal() time.Duration {
	if s.beat > 0 {
		return s.beat
	}
	if s.RegistrationTTL > 0 {
		return min(DefaultRenewal, s.RegistrationTTL/12)
	}
	return DefaultRenewal
}

func (s *Store) registrationTTL() time.Duration {
	if s.markerTTL > 0 {
		return s.markerTTL
	}
	if s.RegistrationTTL > 0 {
		return s.RegistrationTTL
	}
	return DefaultRegistrationTTL
}

// registrationSubject is where a write whose object chunks are on
// $O.<bucket>.C.<nuid> registers: a subject below the chunks' own, which
// nothing of the object store reads.
func registrationSubject(bucket, nuid string) string {
	return ChunkPrefix(bucket) + nuid + ".writing"
}

// registrationBody is what a registration holds: the spill's name and the
// chunk subjects (by NUID) the write fills.
type registrationBody struct {
	Name  string   `json:"name"`
	NUIDs []string `json:"nuids"`
}

// registration is a write's entry in the bucket, renewed by a goroutine of
// its own until end.
type registration struct {
	s       *Store
	subject string
	body    []byte
	stop    chan struct{}
	done    chan struct{}
	ended   bool

	mu      sync.Mutex
	renewed time.Time // the last renewal stored
}

// register publishes the registration of a write of name filling the chunk
// subjects of nuids (the first names the registration) and starts
// renewing it.
func (s *Store) register(ctx context.Context, name string, nuids ...string) (*registration, error) {
	body, err := json.Marshal(registrationBody{Name: name, NUIDs: nuids})
	if err != nil {
		return nil, permanent(fmt.Errorf("spill: encode the registration of %s: %w", name, err))
	}
	r := &registration{
		s: s, subject: registrationSubject(s.Bucket, nuids[0]), body: body,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	if err := r.publish(ctx); err != nil {
		return nil, fmt.Errorf("spill: register the write of %s in bucket %s: %w", name, s.Bucket, err)
	}
	r.renewed = time.Now()
	go r.renew(ctx)
	return r, nil
}

// publish stores the registration, replacing the one before it.
func (r *registration) publish(ctx context.Context) error {
	msg := nats.NewMsg(r.subject)
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	msg.Data = r.body
	pctx, cancel := context.WithTimeout(ctx, ackWait)
	defer cancel()
	_, err := r.s.JS.PublishMsg(pctx, msg, jetstream.WithExpectStream(StreamName(r.s.Bucket)))
	return err
}

// renew publishes the registration every renewal period until end is
// called or ctx is done.
func (r *registration) renew(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.s.renewal())
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
			if r.publish(ctx) == nil {
				r.mu.Lock()
				r.renewed = time.Now()
				r.mu.Unlock()
			}
		}
	}
}

// lapsed fails once the registration went unrenewed for half its TTL: a
// sweep may then have taken the write's chunks for a dead writer's.
func (r *registration) lapsed() error {
	r.mu.Lock()
	since := time.Since(r.renewed)
	r.mu.Unlock()
	if ttl := r.s.registrationTTL(); since > ttl/2 {
		return fmt.Errorf("spill: the write's registration in bucket %s was last renewed %s ago (it lasts %s): its chunks may have been swept",
			r.s.Bucket, since.Round(time.Millisecond), ttl)
	}
	return nil
}

// end stops the renewals and, with remove, removes the registration (with
// a context of its own: ctx may have ended, which is why the write ends).
func (r *registration) end(ctx context.Context, remove bool) {
	if r.ended {
		return
	}
	r.ended = true
	close(r.stop)
	<-r.done
	if remove {
		r.s.purgeChunks(ctx, r.subject)
	}
}

// SweepReport says what a sweep found and removed.
type SweepReport struct {
	Subjects   int    // chunk subjects in the bucket
	Orphans    int    // chunk subjects purged: no info named them and no live write had registered them
	Messages   uint64 // the chunks those held
	Young      int    // unnamed chunk subjects left alone: their newest chunk is younger than minAge
	Writes     int    // writes in progress (live registrations)
	Registered int    // chunk subjects those registered
	Stale      int    // registrations of dead writers removed
}

// SweepOrphans removes the chunks of the bucket that no object needs: the
// chunks of a write that died before it stored its info or purged them (a
// process killed mid-spill), of an object a third party deleted without
// its replay state, or of a version replaced while its writer stopped.
// A chunk subject is purged only when no object info names it (as its
// chunks or its replay state), no live write registered it, and its newest
// chunk is at least minAge old. Writes renew their registration every
// DefaultRenewal; one unrenewed for DefaultRegistrationTTL is a dead
// writer's, and is removed too. Ages are measured against the server's
// timestamps with this machine's clock.
//
// Use a minAge well above the time a spill takes to write and the longest
// replication lag (10 minutes, say): a write by something else than a
// Store (nats.go's Put, the nats CLI) registers nothing, and only minAge
// keeps its chunks. SweepOrphans may run on any number of instances at
// once and beside any number of writes; it only reads the bucket and
// purges subjects.
func (s *Store) SweepOrphans(ctx context.Context, minAge time.Duration) (SweepReport, error) {
	var rep SweepReport
	if err := s.Validate(); err != nil {
		return rep, err
	}
	if minAge < 0 {
		return rep, fmt.Errorf("spill: sweep: minAge is %s; it must be 0 or more", minAge)
	}
	fail := func(what string, err error) (SweepReport, error) {
		return rep, fmt.Errorf("spill: sweep bucket %s: %s: %w", s.Bucket, what, err)
	}
	rctx, cancel := context.WithTimeout(ctx, sweepWait)
	defer cancel()
	str, err := s.JS.Stream(rctx, StreamName(s.Bucket))
	if err != nil {
		return fail("open its stream", err)
	}
	obs, err := s.JS.ObjectStore(rctx, s.Bucket)
	if err != nil {
		return fail("open it", err)
	}

	// The order matters. A write registers before its first chunk, and
	// removes its registration only once its info is stored: so every
	// chunk subject listed first is, by the time the registrations and
	// then the infos are read, named by one of them, or no longer needed.
	prefix := ChunkPrefix(s.Bucket)
	si, err := str.Info(rctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return fail("list its chunk subjects", err)
	}
	chunks := map[string]uint64{} // NUID -> messages
	var regs []string             // registration subjects
	for subj, n := range si.State.Subjects {
		rest := strings.TrimPrefix(subj, prefix)
		switch tok, tail, _ := strings.Cut(rest, "."); {
		case tail == "":
			chunks[tok] = n
		case tail == "writing":
			regs = append(regs, subj)
		}
	}
	rep.Subjects = len(chunks)

	now := time.Now()
	keep := map[string]bool{}
	var stale []string
	for _, subj := range regs {
		m, err := s.lastMsg(ctx, str, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // the write ended meanwhile
		}
		if err != nil {
			return fail("read registration "+subj, err)
		}
		if now.Sub(m.Time) >= s.registrationTTL() {
			stale = append(stale, subj)
			continue
		}
		var body registrationBody
		if err := json.Unmarshal(m.Data, &body); err != nil {
			continue // not a Store's registration; minAge still guards its chunks
		}
		rep.Writes++
		for _, n := range body.NUIDs {
			keep[n] = true
			rep.Registered++
		}
	}

	lctx, cancel := context.WithTimeout(ctx, sweepWait)
	infos, err := obs.List(lctx)
	cancel()
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return fail("list its objects", err)
	}
	for _, info := range infos {
		keep[info.NUID] = true
		if st := info.Metadata[metaStateNUID]; st != "" {
			keep[st] = true
		}
	}

	for nuid, n := range chunks {
		if keep[nuid] {
			continue
		}
		subj := prefix + nuid
		m, err := s.lastMsg(ctx, str, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // purged meanwhile
		}
		if err != nil {
			return fail("read "+subj, err)
		}
		if now.Sub(m.Time) < minAge {
			rep.Young++
			continue
		}
		if err := s.purgeSubject(ctx, str, subj); err != nil {
			return fail("purge "+subj, err)
		}
		rep.Orphans++
		rep.Messages += n
	}
	for _, subj := range stale {
		if err := s.purgeSubject(ctx, str, subj); err != nil {
			return fail("purge "+subj, err)
		}
		rep.Stale++
	}
	return rep, nil
}

// lastMsg reads the newest message on subj, waiting at most sweepWait.
func (s *Store) lastMsg(ctx context.Context, str jetstream.Stream, subj string) (*jetstream.RawStreamMsg, error) {
	gctx, cancel := context.WithTimeout(ctx, sweepWait)
	defer cancel()
	return str.GetLastMsgForSubject(gctx, subj)
}

// purgeSubject purges subj, waiting at most sweepWait.
func (s *Store) purgeSubject(ctx context.Context, str jetstream.Stream, subj string) error {
	pctx, cancel := context.WithTimeout(ctx, sweepWait)
	defer cancel()
	return str.Purge(pctx, jetstream.WithPurgeSubject(subj))
}
