package spill

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/seamguard/seamguard/events"
)

// GetChain streams the whole chain of the spill called name to w, oldest
// spill first, and returns the chain's handles in that order. Each object
// is verified as Get verifies it (the error wraps ErrDigestMismatch,
// reported after its bytes were copied). The objects' lines together are
// the session's accepted events from its first to name's LastSeq.
//
// The chain is followed back through each object's previous spill, read
// from its info before any byte is copied: a missing previous spill, one
// not written by a Store, one of another session or out of order, a loop,
// or a chain longer than MaxChain is an error wrapping ErrChain (a missing
// name itself matches jetstream.ErrObjectNotFound).
func (s *Store) GetChain(ctx context.Context, name string, w io.Writer) ([]events.SpillHandle, error) {
	obs, err := s.JS.ObjectStore(ctx, s.Bucket)
	if err != nil {
		return nil, fmt.Errorf("spill: open bucket %s: %w", s.Bucket, err)
	}
	infos, hs, err := s.chainOf(ctx, obs, name)
	if err != nil {
		return nil, err
	}
	for _, info := range infos {
		if err := s.read(ctx, info, w); err != nil {
			return hs, err
		}
	}
	return hs, nil
}

// Chain returns the handles of the chain of the spill called name, oldest
// first, without reading the objects; it fails as GetChain does.
func (s *Store) Chain(ctx context.Context, name string) ([]events.SpillHandle, error) {
	obs, err := s.JS.ObjectStore(ctx, s.Bucket)
	if err != nil {
		return nil, fmt.Errorf("spill: open bucket %s: %w", s.Bucket, err)
	}
	_, hs, err := s.chainOf(ctx, obs, name)
	return hs, err
}

// chainOf reads the infos and handles of name's chain, newest first as it
// follows the links, and returns them oldest first. On an error it returns
// the part it read, oldest first as well (the chain's tail, ending at name).
func (s *Store) chainOf(ctx context.Context, obs jetstream.ObjectStore, name string) ([]*jetstream.ObjectInfo, []events.SpillHandle, error) {
	var (
		infos []*jetstream.ObjectInfo
		hs    []events.SpillHandle
		seen  = map[string]bool{}
		limit = s.maxChain()
		err   error
	)
	done := func(e error) ([]*jetstream.ObjectInfo, []events.SpillHandle, error) {
		slices.Reverse(infos)
		slices.Reverse(hs)
		return infos, hs, e
	}
	// Each pass adds a name never seen before, and there are at most
	// limit of them.
	for next := name; next != ""; {
		child := ""
		if len(hs) > 0 {
			child = hs[len(hs)-1].Name
		}
		if seen[next] {
			return done(fmt.Errorf("%w: %s names %s as its previous spill, which follows it: the chain loops", ErrChain, child, next))
		}
		if len(hs) == limit {
			return done(fmt.Errorf("%w: the chain of %s is longer than %d spills (Store.MaxChain)", ErrChain, name, limit))
		}
		seen[next] = true
		var info *jetstream.ObjectInfo
		info, err = obs.GetInfo(ctx, next)
		if err != nil {
			if child == "" {
				return done(fmt.Errorf("spill: info of %s in bucket %s: %w", next, s.Bucket, err))
			}
			return done(fmt.Errorf("%w: %s names %s as its previous spill, and bucket %s cannot give it: %w", ErrChain, child, next, s.Bucket, err))
		}
		h, herr := HandleOf(info)
		if herr != nil {
			return done(fmt.Errorf("%w: %w", ErrChain, herr))
		}
		if len(hs) > 0 {
			c, cinfo := hs[len(hs)-1], infos[len(infos)-1]
			switch {
			case info.Metadata[metaSession] != cinfo.Metadata[metaSession]:
				return done(fmt.Errorf("%w: %s (session %s) names %s of session %s as its previous spill",
					ErrChain, c.Name, cinfo.Metadata[metaSession], next, info.Metadata[metaSession]))
			case h.LastSeq >= c.FirstSeq:
				return done(fmt.Errorf("%w: %s starts at stream sequence %d, but its previous spill %s ends at %d",
					ErrChain, c.Name, c.FirstSeq, next, h.LastSeq))
			}
		}
		infos, hs = append(infos, info), append(hs, h)
		next = ""
		if h.Previous != nil {
			next = *h.Previous
		}
	}
	return done(nil)
}
