package spill

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReaderReadAt reads a spill of several chunks through a Reader, in
// pieces of several sizes, following the cursors or without them, with
// the chunk index and without it: the bytes are the spill's. Spill and
// ReadAt refuse what they must with the kind of their refusal.
func TestReaderReadAt(t *testing.T) {
	h := newHarness(t, nil)
	ctx := testCtx(t)
	req, _ := smallSession(t, h, 60, strings.Repeat("r", 3000))
	h.store.ChunkSize = 16 << 10
	_, err := h.store.Write(ctx, req)
	require.NoError(t, err)
	want := h.expected("alpha")
	obs, err := h.js.ObjectStore(ctx, Bucket)
	require.NoError(t, err)
	r := NewReader(h.js, Bucket, obs)

	info, hd, err := r.Spill(ctx, "alpha", req.Name)
	require.NoError(t, err)
	assert.Equal(t, req.Name, hd.Name)
	require.Greater(t, info.Chunks, uint32(3))
	_, ok := ChunkIndexOf(info)
	require.True(t, ok, "the writer recorded the chunk index")
	plain := *info
	plain.Metadata = maps.Clone(info.Metadata)
	delete(plain.Metadata, metaChunkSeqs)

	for _, in := range []*jetstream.ObjectInfo{info, &plain} {
		for _, limit := range []int{1000, 16 << 10, 40 << 10} {
			for _, follow := range []bool{true, false} {
				var got []byte
				cur := ""
				for uint64(len(got)) < in.Size {
					b, next, err := r.ReadAt(ctx, in, uint64(len(got)), limit, cur)
					require.NoError(t, err)
					require.NotEmpty(t, b)
					require.LessOrEqual(t, len(b), limit)
					got = append(got, b...)
					require.Equal(t, uint64(len(got)) == in.Size, next == "", "a cursor until the end, none at it")
					if follow {
						cur = next
					}
				}
				require.Equal(t, string(want), string(got), "limit %d, cursors %v", limit, follow)
			}
		}
	}

	kind := func(err error) ReadKind {
		var re *ReadError
		if !errors.As(err, &re) {
			return 0
		}
		return re.Kind
	}
	_, _, err = r.Spill(ctx, "alpha", "alpha/99.jsonl")
	assert.Equal(t, ReadNotFound, kind(err))
	assert.ErrorIs(t, err, jetstream.ErrObjectNotFound)
	_, _, err = r.Spill(ctx, "beta", req.Name)
	assert.Equal(t, ReadOtherSession, kind(err))
	_, _, err = r.ReadAt(ctx, info, info.Size+1, 10, "")
	assert.Equal(t, ReadBadRequest, kind(err))
	assert.Contains(t, err.Error(), "is past the end")
	_, _, err = r.ReadAt(ctx, info, 10, 10, "garbage")
	assert.Equal(t, ReadBadRequest, kind(err))
	_, _, err = r.ReadAt(ctx, info, 10, 10, "AnotherVersionOfTheSpil.1.0")
	assert.Equal(t, ReadStale, kind(err))
	assert.Contains(t, err.Error(), "written again")
	b, next, err := r.ReadAt(ctx, info, info.Size, 10, "")
	require.NoError(t, err)
	assert.Empty(t, b)
	assert.Empty(t, next)
}

// TestCursor: a cursor reads back as it was written, in the format
// services hand to their clients; anything else is not one.
func TestCursor(t *testing.T) {
	c := cursor{nuid: "AbC123", seq: 42, start: 1 << 20}
	assert.Equal(t, "AbC123.42.1048576", c.String())
	got, ok := parseCursor(c.String())
	require.True(t, ok)
	assert.Equal(t, c, got)
	for _, bad := range []string{"", "garbage", ".1.0", "n.0.0", "n.1", "n.1.2.3", "n.x.0", "n.1.-1"} {
		_, ok := parseCursor(bad)
		assert.False(t, ok, "%q", bad)
	}
}
