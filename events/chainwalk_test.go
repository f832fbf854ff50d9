package events

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// walkOver is a ChainWalk over handles in memory, with the sessions of
// sessions (none: "").
func walkOver(hs map[string]SpillHandle, sessions map[string]string) ChainWalk {
	return ChainWalk{Get: func(_ context.Context, name string) (SpillHandle, string, error) {
		h, ok := hs[name]
		if !ok {
			return SpillHandle{}, "", fmt.Errorf("no %s: %w", name, fs.ErrNotExist)
		}
		return h, sessions[name], nil
	}}
}

func linked(name string, first, last uint64, previous string) SpillHandle {
	h := SpillHandle{Name: name, FirstSeq: first, LastSeq: last}
	if previous != "" {
		h.Previous = &previous
	}
	return h
}

// TestChainWalk: the walk returns the chain oldest first, and each broken
// link as an error wrapping Broken, with the part read before it.
func TestChainWalk(t *testing.T) {
	ctx := context.Background()
	hs := map[string]SpillHandle{
		"a/1": linked("a/1", 1, 5, ""),
		"a/2": linked("a/2", 6, 9, "a/1"),
		"a/3": linked("a/3", 10, 12, "a/2"),
	}
	chain, err := walkOver(hs, nil).Walk(ctx, "a/3")
	require.NoError(t, err)
	assert.Equal(t, []SpillHandle{hs["a/1"], hs["a/2"], hs["a/3"]}, chain)

	w := walkOver(hs, nil)
	w.Max = 2
	chain, err = w.Walk(ctx, "a/3")
	require.ErrorIs(t, err, ErrBrokenChain)
	assert.Contains(t, err.Error(), "the chain of a/3 is longer than 2 spills")
	assert.Equal(t, []SpillHandle{hs["a/2"], hs["a/3"]}, chain, "the tail read")

	_, err = walkOver(hs, map[string]string{"a/3": "a", "a/2": "a", "a/1": "b"}).Walk(ctx, "a/3")
	require.ErrorIs(t, err, ErrBrokenChain)
	assert.Contains(t, err.Error(), "a/2 (session a) names a/1 of session b as its previous spill")

	_, err = walkOver(hs, nil).Walk(ctx, "a/9")
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.NotErrorIs(t, err, ErrBrokenChain, "the newest spill's own error is Get's")

	loop := map[string]SpillHandle{"a/1": linked("a/1", 1, 5, "a/2"), "a/2": linked("a/2", 6, 9, "a/1")}
	_, err = walkOver(loop, nil).Walk(ctx, "a/2")
	require.ErrorIs(t, err, ErrBrokenChain)
	assert.Contains(t, err.Error(), "a/1 names a/2 as its previous spill, which follows it: the chain loops")

	order := map[string]SpillHandle{"a/1": linked("a/1", 1, 7, ""), "a/2": linked("a/2", 6, 9, "a/1")}
	_, err = walkOver(order, nil).Walk(ctx, "a/2")
	require.ErrorIs(t, err, ErrBrokenChain)
	assert.Contains(t, err.Error(), "a/2 starts at stream sequence 6, but its previous spill a/1 ends at 7")

	// A missing previous spill: wrapping Broken and Get's error, or Get's
	// error alone.
	gone := map[string]SpillHandle{"a/2": linked("a/2", 6, 9, "a/1")}
	_, err = walkOver(gone, nil).Walk(ctx, "a/2")
	require.ErrorIs(t, err, ErrBrokenChain)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	mine := errors.New("mine")
	w = walkOver(gone, nil)
	w.Broken, w.GetSaysWhy = mine, true
	_, err = w.Walk(ctx, "a/2")
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.NotErrorIs(t, err, mine)
	assert.NotErrorIs(t, err, ErrBrokenChain)
	assert.Equal(t, "a/2 names a/1 as its previous spill: no a/1: file does not exist", err.Error())
	_, err = w.Walk(ctx, "a/3")
	require.ErrorIs(t, err, fs.ErrNotExist)

	w = walkOver(loop, nil)
	w.Broken = mine
	_, err = w.Walk(ctx, "a/2")
	require.ErrorIs(t, err, mine)
	assert.NotErrorIs(t, err, ErrBrokenChain)
}
