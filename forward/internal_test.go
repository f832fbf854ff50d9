package forward

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
)

func TestPercentEncoding(t *testing.T) {
	for in, want := range map[string]string{
		"sg-0123abc":              "sg-0123abc",
		"urn:seamguard:processor": "urn:seamguard:processor",
		"a b":                     "a%20b",
		`quo"te`:                  "quo%22te",
		"100%":                    "100%25",
		"é\n":                     "%C3%A9%0A",
	} {
		got := events.PercentEncode(in)
		assert.Equal(t, want, got, in)
		assert.Equal(t, in, percentDecode(got), in)
		dec, err := url.PathUnescape(got)
		require.NoError(t, err)
		assert.Equal(t, in, dec, "a receiver decodes it with the standard library")
	}
}

// TestRequestEncodesHeaders: an id an agent chose, with a space and a line
// break, reaches the receiver percent-encoded, where Go's HTTP client would
// refuse it raw.
func TestRequestEncodesHeaders(t *testing.T) {
	o := events.Output{Type: events.TypeSessionHalted, Session: "s1", Cause: events.Cause{ID: "my id\nwith é", Source: "urn:a"},
		Data: &events.SessionHalted{RequestID: "r", Message: "m"}}
	_, subject, body, err := events.Encoder{}.Encode(o)
	require.NoError(t, err)
	req, err := newRequest(context.Background(), "http://127.0.0.1:9/", map[string]string{"Authorization": "Bearer x"}, verdictMsg{subject: subject, body: body, seq: 7})
	require.NoError(t, err)
	assert.Equal(t, "my%20id%0Awith%20%C3%A9", req.Header.Get("Ce-Causationid"))
	assert.Equal(t, "Bearer x", req.Header.Get("Authorization"))
	assert.Equal(t, "7", req.Header.Get(HeaderVerdictSeq))
	for k, vs := range req.Header {
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				assert.False(t, v[i] < ' ' || v[i] > '~', "header %s holds a byte HTTP cannot carry: %q", k, v)
			}
		}
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		status int
		err    error
		class  string
		retry  bool
	}{
		{200, nil, "", false}, {204, nil, "", false},
		{400, nil, "status_4xx", false}, {404, nil, "status_4xx", false}, {422, nil, "status_4xx", false},
		{408, nil, "status_408", true}, {429, nil, "status_429", true},
		{500, nil, "status_5xx", true}, {503, nil, "status_5xx", true},
		{301, nil, "status_other", false}, {100, nil, "status_other", false},
		{0, context.DeadlineExceeded, "timeout", true},
		{0, errors.New("connection refused"), "connection", true},
	} {
		class, retry := classify(tc.status, tc.err)
		assert.Equal(t, tc.class, class, "%d %v", tc.status, tc.err)
		assert.Equal(t, tc.retry, retry, "%d %v", tc.status, tc.err)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	assert.Equal(t, 3*time.Second, parseRetryAfter("3", now))
	assert.Equal(t, time.Duration(0), parseRetryAfter("", now))
	assert.Equal(t, time.Duration(0), parseRetryAfter("soon", now))
	assert.Equal(t, 90*time.Second, parseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now))
	assert.Equal(t, time.Duration(0), parseRetryAfter(now.Add(-time.Minute).Format(http.TimeFormat), now))
}

func TestBackoff(t *testing.T) {
	f := &Forwarder{cfg: Config{MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}}
	for attempt, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 3: 400 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 50: time.Second} {
		for range 20 {
			d := f.backoff(attempt)
			assert.GreaterOrEqual(t, d, want/2, "attempt %d", attempt)
			assert.LessOrEqual(t, d, want, "attempt %d", attempt)
		}
	}
}

func TestDataSpan(t *testing.T) {
	body := []byte(`{"specversion":"1.0", "nested":{"data":1}, "data" : {"a":[1,2]} ,"x":1}`)
	s, e, err := dataSpan(body)
	require.NoError(t, err)
	assert.Equal(t, `{"a":[1,2]}`, string(body[s:e]))
	_, _, err = dataSpan([]byte(`{"id":"x"}`))
	assert.ErrorIs(t, err, ErrMalformed)
	_, _, err = dataSpan([]byte(`[1]`))
	assert.ErrorIs(t, err, ErrMalformed)
}
