package spill

import (
	"context"
	"fmt"
	"io"

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

// chainOf reads the infos and handles of name's chain (events.ChainWalk), and
// returns them oldest first. On an error it returns the part it read,
// oldest first as well (the chain's tail, ending at name).
func (s *Store) chainOf(ctx context.Context, obs jetstream.ObjectStore, name string) ([]*jetstream.ObjectInfo, []events.SpillHandle, error) {
	read := map[string]*jetstream.ObjectInfo{}
	walk := events.ChainWalk{Max: s.maxChain(), Broken: ErrChain, Get: func(ctx context.Context, next string) (events.SpillHandle, string, error) {
		info, err := obs.GetInfo(ctx, next)
		if err != nil {
			return events.SpillHandle{}, "", fmt.Errorf("spill: info of %s in bucket %s: %w", next, s.Bucket, err)
		}
		h, err := HandleOf(info)
		switch {
		case err != nil && next == name:
			return events.SpillHandle{}, "", fmt.Errorf("%w: %w", ErrChain, err)
		case err != nil:
			return events.SpillHandle{}, "", err // the walk wraps ErrChain
		}
		read[next] = info
		return h, SessionOf(info), nil
	}}
	hs, err := walk.Walk(ctx, name)
	infos := make([]*jetstream.ObjectInfo, len(hs))
	for i, h := range hs {
		infos[i] = read[h.Name]
	}
	return infos, hs, err
}
