package spill

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// replay is how Write learns which events the processor accepted: a shadow
// ledger, stepped with the session's events from `from` on.
type replay struct {
	shadow ledger.Ledger
	from   uint64 // the first stream sequence read; 0: the session's oldest event in the stream
	first  bool   // the event at from must be the session's first: nothing before it is replayed
	// chain holds the earlier spills of the chain by LastSeq: the
	// replay answers their requests with success.
	chain map[uint64]events.SpillHandle
	// why says why the replay starts at the session's first event
	// although the spill has a previous one; "" when it does not.
	why string
}

// because is what an error adds when the replay had to start at the
// session's first event.
func (rp *replay) because() string {
	if rp.why == "" {
		return ""
	}
	return " (the whole session was replayed, since " + rp.why + ")"
}

// plan finds where the replay starts. A chain's first spill replays from
// its FirstSeq, the session's first event. A later one restores the shadow
// from the state stored with its previous spill and replays only what came
// after it; when that state cannot be read, it replays from the session's
// first event, found by walking the chain back, and reads (but does not
// write) everything before FirstSeq.
func (s *Store) plan(ctx context.Context, obs jetstream.ObjectStore, req ledger.SpillRequest) *replay {
	rp := &replay{from: req.FirstSeq, first: true}
	if req.Previous == "" {
		return rp
	}
	from, err := s.restore(ctx, obs, req, &rp.shadow)
	if err == nil {
		rp.from, rp.first = from, false
		return rp
	}
	rp.shadow = ledger.Ledger{}
	rp.why = err.Error()
	_, chain, werr := s.chainOf(ctx, obs, req.Previous)
	rp.chain = make(map[uint64]events.SpillHandle, len(chain))
	for _, h := range chain {
		rp.chain[h.LastSeq] = h
	}
	if werr == nil && len(chain) > 0 && chain[0].Previous == nil && chain[0].FirstSeq <= req.FirstSeq {
		rp.from = chain[0].FirstSeq
		return rp
	}
	// The chain's start is unknown: the session's oldest event in the
	// stream must be its session.opened, which the count of accepted
	// events checks in the end.
	rp.from, rp.first = 0, false
	return rp
}

// restore sets l to the state stored with req's previous spill and returns
// the stream sequence the replay goes on from.
func (s *Store) restore(ctx context.Context, obs jetstream.ObjectStore, req ledger.SpillRequest, l *ledger.Ledger) (uint64, error) {
	info, err := obs.GetInfo(ctx, req.Previous)
	if err != nil {
		return 0, fmt.Errorf("the previous spill %s could not be read: %w", req.Previous, err)
	}
	prev, err := HandleOf(info)
	if err != nil {
		return 0, err
	}
	if prev.LastSeq >= req.FirstSeq {
		return 0, fmt.Errorf("the previous spill %s ends at stream sequence %d, not before this one's first, %d", req.Previous, prev.LastSeq, req.FirstSeq)
	}
	st, seq, err := stateOf(info)
	if err != nil {
		return 0, err
	}
	if seq != prev.LastSeq {
		return 0, fmt.Errorf("the state stored with %s is at stream sequence %d, not at its last, %d", req.Previous, seq, prev.LastSeq)
	}
	var b bytes.Buffer
	if err := s.read(ctx, st, &b); err != nil {
		return 0, fmt.Errorf("the state stored with %s could not be read: %w", req.Previous, err)
	}
	if err := l.UnmarshalBinary(b.Bytes()); err != nil {
		return 0, fmt.Errorf("the state stored with %s could not be decoded: %w", req.Previous, err)
	}
	if l.Session() != req.Session || l.Pending() {
		return 0, fmt.Errorf("the state stored with %s is not session %s's after a spill", req.Previous, req.Session)
	}
	return seq + 1, nil
}

// stateOf describes the chunks of the state stored with a spill as an
// object of its own (for read), and returns the stream sequence the
// replay had reached.
func stateOf(info *jetstream.ObjectInfo) (*jetstream.ObjectInfo, uint64, error) {
	md := info.Metadata
	nuid, digest := md[metaStateNUID], md[metaStateDigest]
	if nuid == "" || digest == "" {
		return nil, 0, fmt.Errorf("spill %s has no stored state (written by an older seamguard?)", info.Name)
	}
	var nums [3]uint64
	for i, k := range [3]string{metaStateChunks, metaStateSize, metaStateSeq} {
		n, err := strconv.ParseUint(md[k], 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("spill %s: metadata %s=%q is not a number", info.Name, k, md[k])
		}
		nums[i] = n
	}
	if nums[0] > 1<<20 {
		return nil, 0, fmt.Errorf("spill %s: its state is said to have %d chunks", info.Name, nums[0])
	}
	st := &jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: info.Name + " (its replay state)", Opts: info.Opts},
		Bucket:     info.Bucket, NUID: nuid, Size: nums[1], Chunks: uint32(nums[0]), Digest: digest,
	}
	return st, nums[2], nil
}

// finish answers this spill's own request in the shadow ledger with its
// handle, as the processor will once Write returns, and returns the
// snapshot the next spill of the chain restores.
func (rp *replay) finish(h events.SpillHandle, cfg ledger.Config) ([]byte, error) {
	if rp.shadow.Pending() {
		if _, err := ledger.Step(&rp.shadow, ledger.Input{Spill: &ledger.SpillResult{Handle: h}}, cfg); err != nil {
			return nil, permanent(fmt.Errorf("spill: replay of %s: %w", h.Name, err))
		}
	}
	b, err := rp.shadow.MarshalBinary()
	if err != nil {
		return nil, permanent(fmt.Errorf("spill: snapshot of the replay of %s: %w", h.Name, err))
	}
	if len(b) == 0 {
		return nil, permanent(errors.New("spill: the replay's snapshot is empty"))
	}
	return b, nil
}
