package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/gateway/read"
)

// TestSpillGetOverHTTP: GET /v1/sessions/{session}/spills/{n} serves the
// very bytes `seamguard spill get` writes, for a chain of two spills.
func TestSpillGetOverHTTP(t *testing.T) {
	srv, _, _, _ := spillChain(t)
	h, err := read.New(srv.JS, read.Loopback{}, read.Config{})
	require.NoError(t, err)
	mux := http.NewServeMux()
	h.Register(mux)
	hs := httptest.NewServer(mux)
	defer hs.Close()

	for _, n := range []string{"1", "2"} {
		code, out, stderr := runCLI(t, "", "spill", "get", "s/"+n+".jsonl", "--nats-url", srv.Server.ClientURL())
		require.Equal(t, 0, code, stderr)
		resp, err := http.Get(hs.URL + "/v1/sessions/s/spills/" + n)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		assert.Equal(t, out, string(b), "spill %s", n)
		assert.NotEmpty(t, resp.Header.Get("Digest"))
	}
}
