package events

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRangeString(t *testing.T) {
	assert.Equal(t, "[0, 5)", Range{Start: 0, End: 5}.String())
	assert.Equal(t, "[0, 0)", Range{}.String())
	assert.Equal(t, "[9007199254740992, 9007199254740992)", Range{Start: MaxOffset, End: MaxOffset}.String())
	rs := []Range{{Start: 0, End: 5}, {Start: 8, End: 9}}
	assert.Equal(t, "[[0, 5) [8, 9)]", fmt.Sprintf("%v", rs))
	assert.Equal(t, "[0, 5)", fmt.Sprint(rs[0]))
	assert.Equal(t, "{Range:[3, 4) Stage:budget}", fmt.Sprintf("%+v", ContextTruncated{Range: Range{Start: 3, End: 4}, Stage: "budget"}))
}

func TestPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"":                        "",
		"urn:agent:demo/worker-1": "urn:agent:demo/worker-1",
		"a b":                     "a%20b",
		`"100%"`:                  "%22100%25%22",
		"ë":                       "%C3%AB",
		"tab\there\x7f":           "tab%09here%7F",
		"😀":                       "%F0%9F%98%80",
	} {
		assert.Equal(t, want, PercentEncode(in), "%q", in)
		back, problem := percentDecode(PercentEncode(in))
		assert.Empty(t, problem, "%q", in)
		assert.Equal(t, in, back, "%q decodes back", in)
	}
}

func TestDigests(t *testing.T) {
	sum := sha256.Sum256([]byte("hello"))
	raw := "SHA-256=" + base64.RawURLEncoding.EncodeToString(sum[:])
	padded := "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
	got, err := DecodeDigest(padded)
	require.NoError(t, err)
	assert.Equal(t, sum[:], got)
	assert.True(t, SameDigest(padded, raw))
	assert.True(t, SameDigest("sha-256="+base64.RawURLEncoding.EncodeToString(sum[:]), raw), "the algorithm's case does not matter")
	other := sha256.Sum256([]byte("other"))
	assert.False(t, SameDigest(raw, "SHA-256="+base64.RawURLEncoding.EncodeToString(other[:])))
	for _, bad := range []string{"", "SHA-256", "MD5=" + base64.RawURLEncoding.EncodeToString(sum[:]),
		"SHA-256=" + base64.StdEncoding.EncodeToString(sum[:]), "SHA-256=AAAA", "SHA-256=" + string(make([]byte, 43))} {
		_, err := DecodeDigest(bad)
		assert.Error(t, err, "%q", bad)
		assert.False(t, SameDigest(bad, raw), "%q", bad)
		assert.False(t, SameDigest(bad, bad), "%q", bad)
	}
}
