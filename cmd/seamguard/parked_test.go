package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/internal/embedded"
	"github.com/seamguard/seamguard/processor"
)

// TestReadyzNamesParkedSessions: a parked session leaves /readyz at 200
// (every other session is decided) and is named in its body, with the
// cause and how to let it go.
func TestReadyzNamesParkedSessions(t *testing.T) {
	srv := embedded.StartTest(t)
	at := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	recs := []processor.ParkRecord{{Session: "bloated", Cause: "message size exceeds maximum allowed", ParkedAt: at, StoredSeq: 259}}
	h := health{nc: srv.NC, ready: func() error { return nil }, parked: func() []processor.ParkRecord { return recs }}
	ts := httptest.NewServer(h.handler())
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "ready\nparked: session bloated since 2026-11-02T10:00:00Z (stored up to events sequence 259): message size exceeds maximum allowed; seamguard resume bloated --note ... applies its waiting inputs\n", string(body))
}
