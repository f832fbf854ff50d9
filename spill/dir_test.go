package spill

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/processor/ledger"
)

// dirLines writes lines "line <i>" for i in [from, to).
func dirLines(from, to int) func(*Writer) error {
	return func(w *Writer) error {
		for i := from; i < to; i++ {
			if err := w.WriteLine(fmt.Appendf(nil, `{"line":%d}`, i)); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestDirChain writes a chain of three spills into a Dir, as `check` does
// for incremental requests, and reads it back whole, oldest first.
func TestDirChain(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	reqs := []ledger.SpillRequest{
		{Session: "a", Name: "a/1.jsonl", FirstSeq: 1, LastSeq: 10, Events: 4, Range: events.Range{End: 3}},
		{Session: "a", Name: "a/2.jsonl", Previous: "a/1.jsonl", FirstSeq: 11, LastSeq: 20, Events: 3, Range: events.Range{End: 5}},
		{Session: "a", Name: "a/3.jsonl", Previous: "a/2.jsonl", FirstSeq: 21, LastSeq: 22, Events: 2, Range: events.Range{End: 6}},
	}
	var want bytes.Buffer
	var hds []events.SpillHandle
	n := 0
	for _, req := range reqs {
		ww := NewWriter(&want)
		require.NoError(t, dirLines(n, n+int(req.Events))(ww))
		require.NoError(t, ww.Flush())
		n += int(req.Events)
		hd, err := d.Write(req, "b", dirLines(n-int(req.Events), n))
		require.NoError(t, err)
		assert.Equal(t, req.Events, hd.Events)
		assert.Equal(t, req.Range, hd.Range)
		assert.Equal(t, req.FirstSeq, hd.FirstSeq)
		if req.Previous == "" {
			assert.Nil(t, hd.Previous)
		} else {
			require.NotNil(t, hd.Previous)
			assert.Equal(t, req.Previous, *hd.Previous)
		}
		kept, err := d.Handle(req.Name)
		require.NoError(t, err)
		assert.Equal(t, hd, kept)
		hds = append(hds, hd)
	}
	var got bytes.Buffer
	chain, err := d.GetChain("a/3.jsonl", &got)
	require.NoError(t, err)
	assert.Equal(t, hds, chain)
	assert.Equal(t, want.String(), got.String())
	got.Reset()
	_, err = d.Get("a/2.jsonl", hds[1].Digest, &got)
	require.NoError(t, err)
	assert.Equal(t, "{\"line\":4}\n{\"line\":5}\n{\"line\":6}\n", got.String(), "one object holds its stretch alone")

	// Broken chains are refused before a byte is copied.
	relink := func(name, previous string) {
		h, err := d.Handle(name)
		require.NoError(t, err)
		h.Previous = &previous
		b, err := jsonHandle(h)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d.Path, name+handleSuffix), b, 0o644))
	}
	relink("a/1.jsonl", "a/3.jsonl")
	got.Reset()
	_, err = d.GetChain("a/3.jsonl", &got)
	require.ErrorIs(t, err, ErrChain)
	assert.Contains(t, err.Error(), "loops")
	relink("a/1.jsonl", "a/0.jsonl")
	_, err = d.GetChain("a/3.jsonl", &got)
	require.ErrorIs(t, err, ErrChain)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Zero(t, got.Len())
	_, err = d.GetChain("a/9.jsonl", &got)
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.NotErrorIs(t, err, ErrChain)
}

func jsonHandle(h events.SpillHandle) ([]byte, error) {
	var b bytes.Buffer
	_, err := fmt.Fprintf(&b, `{"bucket":%q,"name":%q,"digest":%q,"size":%d,"range":{"start":%d,"end":%d},"events":%d,"first_seq":%d,"last_seq":%d,"previous":%q}`,
		h.Bucket, h.Name, h.Digest, h.Size, h.Range.Start, h.Range.End, h.Events, h.FirstSeq, h.LastSeq, *h.Previous)
	return b.Bytes(), err
}

// TestDirWriteRefuses: a spill over its quota, or with another number of
// events than its request, leaves nothing behind.
func TestDirWriteRefuses(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	req := ledger.SpillRequest{Session: "a", Name: "a/1.jsonl", FirstSeq: 1, LastSeq: 10, Events: 4, MaxBytes: 40}
	_, err := d.Write(req, "b", dirLines(0, 4)) // 4 lines of 11 bytes
	require.ErrorIs(t, err, ErrQuota)
	assert.ErrorIs(t, err, ErrPermanent)
	_, err = d.Write(ledger.SpillRequest{Session: "a", Name: "a/1.jsonl", FirstSeq: 1, LastSeq: 10, Events: 5}, "b", dirLines(0, 4))
	require.ErrorIs(t, err, ErrIncomplete)
	entries, err := os.ReadDir(filepath.Join(d.Path, "a"))
	require.NoError(t, err)
	assert.Empty(t, entries, "no file is left of a refused spill")

	req.MaxBytes = 44
	hd, err := d.Write(req, "b", dirLines(0, 4))
	require.NoError(t, err)
	assert.Equal(t, uint64(44), hd.Size)
}
