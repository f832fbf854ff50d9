package gateway_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/gateway"
)

// corpusCase is a case of the project's bad-input corpus
// (testdata/badinput/corpus.jsonl; processor/badinput_test.go says how
// to read it).
type corpusCase struct {
	Name    string              `json:"name"`
	Modes   []string            `json:"modes"`
	Headers map[string][]string `json:"headers"`
	Body    string              `json:"body"`
	Control *bool               `json:"control"`
	line    int
}

var (
	nestRE = regexp.MustCompile(`@NEST\((\d+)\)@`)
	padRE  = regexp.MustCompile(`@PAD\((\d+)\)@`)
)

func expand(c corpusCase, mode, s string) string {
	m := mode[:1]
	off := "0"
	if m == "s" {
		off = "1"
	}
	s = strings.NewReplacer("@ID@", strconv.Itoa(c.line), "@M@", m, "@OFF@", off).Replace(s)
	s = nestRE.ReplaceAllStringFunc(s, func(x string) string {
		n, _ := strconv.Atoi(nestRE.FindStringSubmatch(x)[1])
		return strings.Repeat("[", n) + strings.Repeat("]", n)
	})
	return padRE.ReplaceAllStringFunc(s, func(x string) string {
		n, _ := strconv.Atoi(padRE.FindStringSubmatch(x)[1])
		return strings.Repeat("x", n)
	})
}

// message is case c in mode as NATS headers and body: a case of both modes
// has a structured body, whose attributes binary mode moves to ce-*
// headers.
func message(t *testing.T, c corpusCase, mode string) (nats.Header, string) {
	h := nats.Header{}
	body := expand(c, mode, c.Body)
	if len(c.Modes) == 2 && mode == "binary" {
		var attrs map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(body), &attrs), c.Name)
		body = ""
		for name, raw := range attrs {
			val := string(raw)
			var s string
			if json.Unmarshal(raw, &s) == nil {
				val = s
			}
			switch name {
			case "data":
				body = string(raw)
			case "datacontenttype":
				h.Set("Content-Type", val)
			default:
				h["ce-"+name] = []string{val}
			}
		}
	} else if mode == "structured" {
		h.Set("Content-Type", events.ContentTypeCloudEventsJSON)
	}
	for k, vs := range c.Headers {
		delete(h, k)
		for _, v := range vs {
			h[k] = append(h[k], expand(c, mode, v))
		}
	}
	return h, body
}

// TestCorpusSameAsNATS posts every case of the bad-input corpus that an
// HTTP client can send, in each of its modes, and requires the answer the
// processor's decoder gives the same message on NATS: the same code,
// field and message for a rejection, and no rejection for the others.
func TestCorpusSameAsNATS(t *testing.T) {
	e := newEnv(t, opts{noProcessor: true})
	f, err := os.Open("../testdata/badinput/corpus.jsonl")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	compared, rejected := 0, 0
	for n := 1; sc.Scan(); n++ {
		var c corpusCase
		require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
		c.line = n
		if c.Control != nil {
			continue // HTTP has no subject to choose: a resume goes to control, the rest to events
		}
		for _, mode := range c.Modes {
			h, body := message(t, c, mode)
			// The subject the event claims, as the gateway routes it.
			session := events.InvalidSession
			claim := h.Get("ce-subject")
			if _, bin := h["ce-specversion"]; !bin || h.Get("Content-Type") == events.ContentTypeCloudEventsJSON {
				var env struct{ Subject string }
				_ = json.Unmarshal([]byte(body), &env)
				claim = env.Subject
			}
			if events.ValidSessionID(claim) {
				session = claim
			}
			_, want := events.DecodeMsg("seamguard.events."+session, h, []byte(body), events.Subjects{})

			req, err := http.NewRequestWithContext(e.ctx, http.MethodPost, e.url+"/v1/events", strings.NewReader(body))
			require.NoError(t, err)
			for k, vs := range h {
				for _, v := range vs {
					req.Header.Add(k, v)
				}
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Logf("%s (%s): not sendable over HTTP: %v", c.Name, mode, err)
				continue
			}
			var rej gateway.Rejection
			_ = json.NewDecoder(res.Body).Decode(&rej)
			res.Body.Close()
			compared++
			if want == nil {
				assert.NotEqual(t, http.StatusBadRequest, res.StatusCode, "%s (%s): NATS accepts it, HTTP rejected it: %+v", c.Name, mode, rej.Data)
				continue
			}
			var we *events.Error
			require.ErrorAs(t, want, &we)
			rejected++
			if !assert.Equal(t, http.StatusBadRequest, res.StatusCode, "%s (%s): NATS rejects it (%s %s)", c.Name, mode, we.Code, we.Field) {
				continue
			}
			assert.Equal(t, we.Code, rej.Data.Code, "%s (%s)", c.Name, mode)
			assert.Equal(t, we.Field, rej.Data.Field, "%s (%s)", c.Name, mode)
			assert.Equal(t, we.Message, rej.Data.Message, "%s (%s)", c.Name, mode)
		}
	}
	require.NoError(t, sc.Err())
	t.Logf("%d requests compared, %d of them rejections", compared, rejected)
	require.Greater(t, rejected, 60)
}
