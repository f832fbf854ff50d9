package gateway_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/seamguard/seamguard/events"
	"github.com/seamguard/seamguard/gateway"
)

// FuzzSameAsNATS holds the gateway to the NATS decoder on any input: a
// request is a 400 exactly when the decoder rejects the same message on
// its session's subject, with the same code, field and message; otherwise
// it is stored (202, or 409 for another event under a (source, id) used
// before); never a 5xx.
func FuzzSameAsNATS(f *testing.F) {
	f.Add(false, "1.0", "i1", "s1", events.TypeTurnAppended, `{"offset":0,"size":1}`)
	f.Add(true, "1.0", "i2", "s1", events.TypeTurnAppended, `{"offset":0,"size":1}`)
	f.Add(true, "1.0", "", "s1", events.TypeTurnAppended, `{"offset":0,"size":1}`)
	f.Add(true, "0.3", "i3", "s.1", "x", `{"offset":-1}`)
	f.Add(false, "", "", "", "", `not json`)
	f.Add(false, "1.0", "i4", "s2", events.TypeSessionOpened, `{"unit":"turns","recovery_floor":{"span":1,"unit":"turns"}}`)
	f.Add(true, "1.0", "i5", "s%2D2", events.TypeSessionClosed, ``)
	e := newEnv(f, opts{noProcessor: true})
	f.Fuzz(func(t *testing.T, binary bool, specversion, id, subject, typ, data string) {
		h := nats.Header{}
		var body string
		if binary {
			h.Set("Content-Type", "application/json")
			for k, v := range map[string]string{"ce-specversion": specversion, "ce-id": id, "ce-source": "urn:fuzz", "ce-subject": subject, "ce-type": typ} {
				if v != "" {
					h[k] = []string{v}
				}
			}
			body = data
		} else {
			h.Set("Content-Type", events.ContentTypeCloudEventsJSON)
			attrs := map[string]any{"specversion": specversion, "id": id, "source": "urn:fuzz", "subject": subject, "type": typ}
			if json.Valid([]byte(data)) {
				attrs["data"] = json.RawMessage(data)
			} else {
				attrs["data"] = data
			}
			b, _ := json.Marshal(attrs)
			body = string(b)
		}
		req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body))
		for k, vs := range h {
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n\x00") {
					return // no HTTP client sends these
				}
				req.Header.Add(k, v)
			}
		}
		rec := httptest.NewRecorder()
		e.gw.ServeHTTP(rec, req)

		session := events.InvalidSession
		claim := subject
		if binary {
			if d, ok := unescape(subject); ok {
				claim = d
			}
		}
		if events.ValidSessionID(claim) {
			session = claim
		}
		// The gateway reads what sdk-go's binding passes on; an HTTP
		// header value is trimmed of spaces on the wire, not here.
		_, err := events.DecodeMsg("seamguard.events."+session, h, []byte(body), events.Subjects{})
		if rec.Code >= 500 {
			t.Fatalf("%d: %s", rec.Code, rec.Body)
		}
		if err == nil {
			if rec.Code != http.StatusAccepted && rec.Code != http.StatusConflict {
				t.Fatalf("NATS accepts it, HTTP answered %d: %s", rec.Code, rec.Body)
			}
			return
		}
		var we *events.Error
		if rec.Code != http.StatusBadRequest {
			t.Fatalf("NATS rejects it (%v), HTTP answered %d: %s", err, rec.Code, rec.Body)
		}
		var rej gateway.Rejection
		if json.Unmarshal(rec.Body.Bytes(), &rej) != nil || !errorAs(err, &we) {
			t.Fatalf("400 is not a rejection: %s", rec.Body)
		}
		// Compared as JSON carries them, on NATS as here: encoding/json
		// writes invalid UTF-8 (a message may cut a quoted value inside a
		// rune) as U+FFFD.
		if rej.Data.Code != we.Code || rej.Data.Field != asJSON(we.Field) || rej.Data.Message != asJSON(we.Message) {
			t.Fatalf("HTTP: %s %q %q; NATS: %s %q %q", rej.Data.Code, rej.Data.Field, rej.Data.Message, we.Code, we.Field, we.Message)
		}
	})
}

func unescape(s string) (string, bool) {
	d, err := url.PathUnescape(s)
	return d, err == nil
}

func errorAs(err error, target **events.Error) bool { return errors.As(err, target) }

// asJSON is s after a round trip through encoding/json.
func asJSON(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}
