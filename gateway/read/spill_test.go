package read

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/spill"
)

// TestSpill: a real processor refuses two compactions of session s and
// spills a chain of two; the endpoint serves each spill's whole chain,
// the bytes spill get writes (spill.Store.GetChain), with their digest.
func TestSpill(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	e.play(t, "s", chainStory("s"), 4)
	store := &spill.Store{JS: e.srv.JS, Stream: e.cfg.Names().Events, Subjects: e.cfg.Subjects(), Bucket: e.cfg.Names().Spills}

	for _, n := range []string{"1", "2", "2.jsonl", "2"} { // the last one from the digest cache
		t.Run(n, func(t *testing.T) {
			name := "s/" + n
			if len(n) == 1 {
				name += ".jsonl"
			}
			var want bytes.Buffer
			chain, err := store.GetChain(e.ctx, name, &want)
			require.NoError(t, err)

			resp := get(t, e.http.URL, http.MethodGet, "/v1/sessions/s/spills/"+n)
			got := body(t, resp)
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
			assert.Equal(t, want.String(), string(got), "the bytes of spill get")
			assert.Equal(t, ContentTypeJSONLines, resp.Header.Get("Content-Type"))
			assert.Equal(t, strconv.Itoa(want.Len()), resp.Header.Get("Content-Length"))
			sum := sha256.Sum256(got)
			assert.Equal(t, "SHA-256="+base64.URLEncoding.EncodeToString(sum[:]), resp.Header.Get("Digest"))
			assert.Equal(t, "sha-256=:"+base64.StdEncoding.EncodeToString(sum[:])+":", resp.Header.Get("Repr-Digest"))
			lines := bytes.Count(got, []byte("\n"))
			if n == "1" {
				require.Len(t, chain, 1)
				assert.Equal(t, 5, lines)
				assert.True(t, events.SameDigest(chain[0].Digest, resp.Header.Get("Digest")), "a chain of one: the handle's digest")
			} else {
				require.Len(t, chain, 2)
				assert.Equal(t, 8, lines, "the whole chain")
				assert.False(t, events.SameDigest(chain[1].Digest, resp.Header.Get("Digest")), "the digest is of the chain, not of the last spill")
			}
		})
	}

	resp := get(t, e.http.URL, http.MethodHead, "/v1/sessions/s/spills/2")
	assert.Empty(t, body(t, resp))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Digest"))

	for _, c := range []struct {
		path   string
		status int
	}{
		{"/v1/sessions/s/spills/3", http.StatusNotFound},
		{"/v1/sessions/nobody/spills/1", http.StatusNotFound},
		{"/v1/sessions/s/spills/0", http.StatusBadRequest},
		{"/v1/sessions/s/spills/01", http.StatusBadRequest},
		{"/v1/sessions/s/spills/+1", http.StatusBadRequest},
		{"/v1/sessions/s/spills/-1", http.StatusBadRequest},
		{"/v1/sessions/s/spills/x", http.StatusBadRequest},
		{"/v1/sessions/s/spills/1.json", http.StatusBadRequest},
		{"/v1/sessions/s/spills/1.jsonl.jsonl", http.StatusBadRequest},
		{"/v1/sessions/s/spills/18446744073709551616", http.StatusBadRequest},
		{"/v1/sessions/s/spills/..%2F..%2Fs%2F1", http.StatusBadRequest},
		{"/v1/sessions/s/spills/1%2F..%2F2", http.StatusBadRequest},
		{"/v1/sessions/s/spills/%31", http.StatusOK}, // "1", escaped: the same spill
		{"/v1/sessions/t%2F..%2Fs/spills/1", http.StatusBadRequest},
		{"/v1/sessions/s%2F1.jsonl/spills/1", http.StatusBadRequest},
		{"/v1/sessions/..%2Fs/spills/1", http.StatusBadRequest},
		{"/v1/sessions/%2E%2E/spills/1", http.StatusBadRequest},
		{"/v1/sessions/s.t/spills/1", http.StatusBadRequest},
		{"/v1/sessions/s*/spills/1", http.StatusBadRequest},
		{"/v1/sessions/" + string(bytes.Repeat([]byte("a"), 129)) + "/spills/1", http.StatusBadRequest},
		{"/v1/sessions/s/spills/", http.StatusNotFound}, // no pattern
	} {
		resp := get(t, e.http.URL, http.MethodGet, c.path)
		b := body(t, resp)
		assert.Equal(t, c.status, resp.StatusCode, "%s: %s", c.path, b)
		if c.status != http.StatusOK {
			assert.Empty(t, resp.Header.Get("Digest"), c.path)
		}
		if c.status == http.StatusBadRequest || c.status == http.StatusNotFound && resp.Header.Get("Content-Type") == ContentTypeProblem {
			var p struct {
				Status int    `json:"status"`
				Detail string `json:"detail"`
			}
			require.NoError(t, json.Unmarshal(b, &p), "%s: %s", c.path, b)
			assert.Equal(t, c.status, p.Status)
			assert.NotEmpty(t, p.Detail)
		}
	}
}

// TestSpillAccess: a caller reads only the sessions Access allows, and a
// denied caller cannot tell a spill that exists from one that does not.
func TestSpillAccess(t *testing.T) {
	e := newEnv(t, onlySession("t"), Config{})
	e.play(t, "s", chainStory("s")[:5], 2)
	e.play(t, "t", chainStory("t")[:5], 4)
	auth := []string{"Authorization", "Bearer x"}

	resp := get(t, e.http.URL, http.MethodGet, "/v1/sessions/t/spills/1", auth...)
	got := body(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
	assert.Contains(t, string(got), `"subject":"t"`)
	assert.NotContains(t, string(got), `"subject":"s"`)

	for _, path := range []string{"/v1/sessions/s/spills/1", "/v1/sessions/s/spills/9", "/v1/sessions/nobody/spills/1"} {
		resp := get(t, e.http.URL, http.MethodGet, path, auth...)
		b := body(t, resp)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", path, b)
		assert.Contains(t, string(b), "may not read session")
		assert.NotContains(t, string(b), "spill", "nothing about the spill")
	}
	resp = get(t, e.http.URL, http.MethodGet, "/v1/sessions/t/spills/1")
	b := body(t, resp)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", b)
	assert.Equal(t, `Bearer realm="seamguard"`, resp.Header.Get("WWW-Authenticate"))

	// Loopback denies a caller that is not on a loopback address.
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "192.0.2.1:1234"
	assert.Equal(t, http.StatusForbidden, statusOf(Loopback{}.Session(req, "t")))
	req.RemoteAddr = "[::ffff:127.0.0.1]:1234"
	assert.NoError(t, Loopback{}.Operator(req))
}

// TestSpillBusy: beyond MaxSpillReads reads at once, 503.
func TestSpillBusy(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{MaxSpillReads: 1})
	e.play(t, "s", chainStory("s")[:5], 2)
	e.h.spillReads <- struct{}{} // a read in flight
	resp := get(t, e.http.URL, http.MethodGet, "/v1/sessions/s/spills/1")
	b := body(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	<-e.h.spillReads
	resp = get(t, e.http.URL, http.MethodGet, "/v1/sessions/s/spills/1")
	b = body(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
}

// TestSpillDamaged: a chain that does not verify is a 500 naming the
// spill, never a 200 with a wrong body.
func TestSpillDamaged(t *testing.T) {
	e := newEnv(t, Loopback{}, Config{})
	e.play(t, "s", chainStory("s"), 4)
	obs, err := e.srv.JS.ObjectStore(e.ctx, e.cfg.Names().Spills)
	require.NoError(t, err)

	// s/1.jsonl's chunks are gone: reading it, or s/2 after it, finds fewer
	// chunks than its info says.
	info, err := obs.GetInfo(e.ctx, "s/1.jsonl")
	require.NoError(t, err)
	str, err := e.srv.JS.Stream(e.ctx, "OBJ_"+e.cfg.Names().Spills)
	require.NoError(t, err)
	require.NoError(t, str.Purge(e.ctx, jetstream.WithPurgeSubject("$O."+e.cfg.Names().Spills+".C."+info.NUID)))
	for _, n := range []string{"1", "2"} {
		resp := get(t, e.http.URL, http.MethodGet, "/v1/sessions/s/spills/"+n)
		b := body(t, resp)
		assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", b)
		assert.Contains(t, string(b), "cannot be served whole")
		assert.Empty(t, resp.Header.Get("Digest"))
	}

	// s/1.jsonl deleted: s/2's chain is broken, s/1 is not found.
	require.NoError(t, obs.Delete(e.ctx, "s/1.jsonl"))
	resp := get(t, e.http.URL, http.MethodGet, "/v1/sessions/s/spills/2")
	b := body(t, resp)
	assert.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "s/1.jsonl")
	resp = get(t, e.http.URL, http.MethodGet, "/v1/sessions/s/spills/1")
	b = body(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
}

// TestSpillNoBucket: before any processor made the spill bucket, a spill
// is not found.
func TestSpillNoBucket(t *testing.T) {
	srv := embedded.StartTest(t)
	h, err := New(srv.JS, Loopback{}, Config{})
	require.NoError(t, err)
	mux := http.NewServeMux()
	h.Register(mux)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	resp := get(t, hs.URL, http.MethodGet, "/v1/sessions/s/spills/1")
	b := body(t, resp)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode, "%s", b)
	resp = get(t, hs.URL, http.MethodGet, "/v1/verdicts?session=s")
	b = body(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", b)
	assert.Contains(t, string(b), "does not exist yet")
}
