package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nuid"

	"github.com/seamguard/seamguard/events"
)

// Source is the CloudEvents source of the rejections the gateway answers
// with.
const Source = "urn:seamguard:gateway"

// problem is the body of an answer that is not a rejection of an event
// (401, 403, 404, 405, 409, 413, 415, 5xx): an RFC 9457 problem document,
// as the read endpoints answer too.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// contentTypeProblem is the media type of a problem document.
const contentTypeProblem = "application/problem+json"

// WriteError answers r with err as a problem document: 401 (with
// WWW-Authenticate) for ErrUnauthenticated, 403 for ErrForbidden, else
// status.
func WriteError(w http.ResponseWriter, status int, err error) {
	switch {
	case errors.Is(err, ErrUnauthenticated):
		status = http.StatusUnauthorized
		w.Header().Set("WWW-Authenticate", `Bearer realm="seamguard"`)
	case errors.Is(err, ErrForbidden):
		status = http.StatusForbidden
	}
	writeJSON(w, status, contentTypeProblem, problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"type":"about:blank","title":"Internal Server Error","status":500,"detail":"cannot encode the answer"}`)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// Rejection is the body of a 400: an io.seamguard.event.rejected
// CloudEvent, as the processor would publish for the same input on NATS
// (the same code, field and message), from the gateway's source, with
// batchindex naming the failing event of a batch (0 for a single event).
type Rejection struct {
	SpecVersion     string               `json:"specversion"`
	ID              string               `json:"id"`
	Source          string               `json:"source"`
	Type            string               `json:"type"`
	Subject         string               `json:"subject,omitempty"`
	DataContentType string               `json:"datacontenttype"`
	CausationID     string               `json:"causationid,omitempty"`
	BatchIndex      int                  `json:"batchindex"`
	Data            events.EventRejected `json:"data"`
}

// rejection builds the 400 body of an event that failed validation.
func rejection(index int, e *events.Error, session, causation string, input events.Meta) Rejection {
	id := "gw-" + nuid.Next()
	return Rejection{
		SpecVersion: "1.0", ID: id, Source: Source, Type: events.TypeEventRejected,
		Subject: session, DataContentType: events.ContentTypeJSON, CausationID: causation,
		BatchIndex: index,
		Data:       events.EventRejected{Code: e.Code, Field: e.Field, Message: e.Message, Input: input},
	}
}

// Error makes a *Rejection an error, so that a reader can return one.
func (r *Rejection) Error() string {
	return fmt.Sprintf("gateway: event %d rejected: %s: %s: %s", r.BatchIndex, r.Data.Code, r.Data.Field, r.Data.Message)
}
