package processor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/spill"
)

// This file holds parking: what becomes of a session stuck for good.
//
// A stuck session's inputs stay unacknowledged, and a partition's consumer
// acknowledges in stream order (ackwindow.go): past MaxAckPending, one
// session whose state can never be stored would stop every other session
// of its partition. A session stuck for Config.ParkAfter on a failure that
// retrying cannot fix is therefore parked:
//
//   - a park record is written to the session bucket under ParkedKey(id),
//     with the cause and the sequence the session's stored state has
//     applied the events stream up to; every input of the session past it
//     waits in the events stream, unapplied;
//   - only once the record is stored are the session's inputs
//     acknowledged ("into the record"), then and for as long as it is
//     parked, so the partition moves on;
//   - an input on the session's control subject (an operator's
//     session.resumed, seamguard resume) takes it out of the park: the
//     record is deleted, and the session is read from the bucket and
//     caught up from the events stream, every waiting input applied in
//     order, before that input is. If it fails again it is stuck, and
//     parked again after ParkAfter.
//
// Nothing of a parked session is lost: its inputs are in the events
// stream, its stored state is what it was. Every instance reads the
// records from the bucket every parkedEvery, so a session parked by one is
// parked for all; an instance that has not read a record yet treats the
// session as any other, which is a retry.

// ParkedKeyPrefix starts the key of a park record in the session bucket.
// Session ids have no dot, so no session's state key starts with it.
const ParkedKeyPrefix = "parked."

// ParkedKey is the key of session's park record in the session bucket.
func ParkedKey(session string) string { return ParkedKeyPrefix + session }

// parkedEvery is how often the processor reads the park records again.
const parkedEvery = 2 * time.Second

// ParkRecord is a parked session's record, stored as JSON.
type ParkRecord struct {
	Session string `json:"session"`
	// Cause is the failure that parked it.
	Cause string `json:"cause"`
	// StuckSince is when it first failed; ParkedAt when it was parked.
	StuckSince time.Time `json:"stuck_since"`
	ParkedAt   time.Time `json:"parked_at"`
	// StoredSeq is the events stream sequence its stored state has
	// applied up to: its inputs past it wait in the events stream.
	StoredSeq uint64 `json:"stored_seq"`
	// By is the source of the instance that parked it.
	By string `json:"by"`
}

// parkedSet is the sessions parked, as this instance knows them. Safe for
// concurrent use.
type parkedSet struct {
	mu sync.Mutex
	m  map[string]ParkRecord
	// local is when this instance last parked or let go of a session: a
	// read of the records begun before it does not undo it.
	local map[string]time.Time
	// n is len(m), read without the lock: every input asks has, and
	// almost always nothing is parked.
	n atomic.Int64
}

func (s *parkedSet) has(id string) bool {
	if s.n.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

// Parked returns the parked sessions this instance knows of, by session
// id. Safe for concurrent use.
func (p *Processor) Parked() []ParkRecord {
	p.parked.mu.Lock()
	defer p.parked.mu.Unlock()
	out := make([]ParkRecord, 0, len(p.parked.m))
	for _, r := range p.parked.m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ParkRecord) int { return strings.Compare(a.Session, b.Session) })
	return out
}

// set records id as parked (rec non-nil) or not, from this instance's own
// act (local) or from a read of the records begun at read.
func (p *Processor) setParked(id string, rec *ParkRecord, local bool, read time.Time) {
	s := &p.parked
	s.mu.Lock()
	if s.m == nil {
		s.m, s.local = map[string]ParkRecord{}, map[string]time.Time{}
	}
	if local {
		s.local[id] = time.Now()
	} else if t, ok := s.local[id]; ok && !t.Before(read) {
		s.mu.Unlock()
		return
	}
	_, was := s.m[id]
	if rec != nil {
		s.m[id] = *rec
	} else {
		delete(s.m, id)
	}
	s.n.Store(int64(len(s.m)))
	s.mu.Unlock()
	if was != (rec != nil) {
		p.obs.Parked(id, rec != nil)
	}
}

// parkable reports whether session id, failing with err, is to be parked:
// the failure is one retrying cannot fix, and the session has been stuck
// for ParkAfter.
func (p *Processor) parkable(id string, err error) bool {
	if id == "" || !(errors.Is(err, errPermanent) || spill.Permanent(err)) {
		return false
	}
	since, ok := p.health.since(stuckPrefix + id)
	return ok && time.Since(since) >= p.cfg.ParkAfter
}

// park stores session id's park record. Only once it is stored may its
// inputs be acknowledged.
func (p *Processor) park(ctx context.Context, id string, cause error) error {
	ctx, cancel := context.WithTimeout(ctx, parkWait)
	defer cancel()
	var stored uint64
	e, err := p.res.Sessions.Get(ctx, id)
	switch {
	case err == nil:
		st, uerr := UnmarshalState(e.Value())
		if uerr == nil {
			stored = st.Seq
		}
	case errors.Is(err, jetstream.ErrKeyNotFound):
	default:
		return fmt.Errorf("processor: parking session %s: reading its state: %w", id, err)
	}
	since, _ := p.health.since(stuckPrefix + id)
	rec := ParkRecord{Session: id, Cause: events.Excerpt(cause.Error()), StuckSince: since.UTC(), ParkedAt: time.Now().UTC(), StoredSeq: stored, By: p.cfg.Source}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := p.res.Sessions.Put(ctx, ParkedKey(id), b); err != nil {
		return fmt.Errorf("processor: parking session %s: %w", id, err)
	}
	p.setParked(id, &rec, true, time.Time{})
	if p.health.clear(stuckPrefix + id) {
		p.obs.Stuck(id, false)
	}
	p.log.Error("session parked: stuck on a failure retrying cannot fix; its inputs wait in the events stream until an operator resumes it (seamguard resume)",
		"session", id, "cause", cause, "stuck_since", rec.StuckSince, "stored_seq", stored, "parked_sessions", p.parked.n.Load())
	return nil
}

// unpark deletes session id's park record, before the input that takes it
// out of the park is applied.
func (p *Processor) unpark(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, parkWait)
	defer cancel()
	if err := p.res.Sessions.Delete(ctx, ParkedKey(id)); err != nil {
		return fmt.Errorf("processor: taking session %s out of its park: %w", id, err)
	}
	p.setParked(id, nil, true, time.Time{})
	p.log.Info("session out of its park: its waiting inputs are applied now", "session", id)
	return nil
}

// readParked reads every park record of the session bucket: the keys from
// the bucket stream's subjects, then each record.
func (p *Processor) readParked(ctx context.Context, kstream jetstream.Stream) error {
	begun := time.Now()
	ctx, cancel := context.WithTimeout(ctx, parkedEvery*5)
	defer cancel()
	prefix := KVPrefix(p.cfg.Names().Sessions)
	info, err := kstream.Info(ctx, jetstream.WithSubjectFilter(prefix+ParkedKeyPrefix+">"))
	if err != nil {
		return err
	}
	found := map[string]ParkRecord{}
	for subj := range info.State.Subjects {
		key := strings.TrimPrefix(subj, prefix)
		e, err := p.res.Sessions.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // let go of: a delete marker
		}
		if err != nil {
			return err
		}
		var rec ParkRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Session != strings.TrimPrefix(key, ParkedKeyPrefix) {
			p.log.Warn("ignoring a park record that does not parse", "key", key, "err", err)
			continue
		}
		found[rec.Session] = rec
	}
	for _, r := range p.Parked() {
		if _, ok := found[r.Session]; !ok {
			p.setParked(r.Session, nil, false, begun)
		}
	}
	for id, rec := range found {
		p.setParked(id, &rec, false, begun)
	}
	// What this instance did before the read began, the read has seen:
	// those marks have served (local stays as small as the acts since).
	p.parked.mu.Lock()
	for id, t := range p.parked.local {
		if t.Before(begun) {
			delete(p.parked.local, id)
		}
	}
	p.parked.mu.Unlock()
	return nil
}

// watchParked reads the park records now and every parkedEvery until ctx
// ends.
func (p *Processor) watchParked(ctx context.Context) {
	kstream, err := p.js.Stream(ctx, p.cfg.Names().SessionsStream())
	t := time.NewTicker(parkedEvery)
	defer t.Stop()
	failing := false
	for {
		if err == nil {
			err = p.readParked(ctx, kstream)
		}
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				p.log.Warn("cannot read the park records; sessions parked by other instances are not known here until it can", "err", err)
			}
			failing = true
			kstream, err = p.js.Stream(ctx, p.cfg.Names().SessionsStream())
		case err == nil && failing:
			failing = false
			p.log.Info("reading the park records again")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
