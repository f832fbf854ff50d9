package events

import (
	"context"
	"fmt"
	"slices"
)

// ChainWalk follows a spill chain back from its newest spill through each
// spill's previous one, checking every link: the one walk of every reader
// of chains (package spill's object store and directory, and the client,
// which reads the handles through the processor's recover service). The
// zero value is not usable: set Get.
type ChainWalk struct {
	// Get reads the handle of the spill called name, and the session it
	// is a spill of, or "" when its store does not say (then a previous
	// spill of another session is not noticed).
	Get func(ctx context.Context, name string) (h SpillHandle, session string, err error)
	// Max bounds the spills of a chain; 0 means MaxRecoverChain.
	Max int
	// Broken is what the error of a link that does not hold wraps; nil
	// means ErrBrokenChain.
	Broken error
	// GetSaysWhy reports a previous spill that Get fails for with Get's
	// error alone, after the link that names it, rather than wrapping
	// Broken too: for a Get whose errors say why already (the client's).
	GetSaysWhy bool
}

// Walk returns the handles of the chain of the spill called name, oldest
// first. Get's error for name itself is returned as it is. A link that
// does not hold is an error wrapping Broken: a previous spill Get fails
// for (wrapping Get's error too), one of another session, one that does
// not end before the spill naming it starts, a loop, a chain longer than
// Max. On an error Walk returns the part it read, oldest first as well
// (the chain's tail, ending at name).
func (w ChainWalk) Walk(ctx context.Context, name string) ([]SpillHandle, error) {
	var (
		hs     []SpillHandle // newest first
		child  string        // the session of the last of hs
		seen   = map[string]bool{}
		limit  = w.Max
		broken = w.Broken
	)
	if limit == 0 {
		limit = MaxRecoverChain
	}
	if broken == nil {
		broken = ErrBrokenChain
	}
	done := func(err error) ([]SpillHandle, error) {
		slices.Reverse(hs)
		return hs, err
	}
	// Each pass adds a name never seen before, and there are at most
	// limit of them.
	for next := name; next != ""; {
		if seen[next] {
			return done(fmt.Errorf("%w: %s names %s as its previous spill, which follows it: the chain loops", broken, hs[len(hs)-1].Name, next))
		}
		if len(hs) == limit {
			return done(fmt.Errorf("%w: the chain of %s is longer than %d spills", broken, name, limit))
		}
		seen[next] = true
		h, session, err := w.Get(ctx, next)
		if err != nil {
			switch {
			case len(hs) == 0:
			case w.GetSaysWhy:
				err = fmt.Errorf("%s names %s as its previous spill: %w", hs[len(hs)-1].Name, next, err)
			default:
				err = fmt.Errorf("%w: %s names %s as its previous spill: %w", broken, hs[len(hs)-1].Name, next, err)
			}
			return done(err)
		}
		if len(hs) > 0 {
			c := hs[len(hs)-1]
			switch {
			case session != child:
				return done(fmt.Errorf("%w: %s (session %s) names %s of session %s as its previous spill", broken, c.Name, child, next, session))
			case h.LastSeq >= c.FirstSeq:
				return done(fmt.Errorf("%w: %s starts at stream sequence %d, but its previous spill %s ends at %d", broken, c.Name, c.FirstSeq, next, h.LastSeq))
			}
		}
		hs, child = append(hs, h), session
		next = ""
		if h.Previous != nil {
			next = *h.Previous
		}
	}
	return done(nil)
}
