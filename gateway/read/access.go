package read

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
)

// Access decides who may read what. The HTTP gateway implements it with
// its bearer tokens. Its methods are called concurrently, once per
// request, before anything is looked up.
type Access interface {
	// Session returns nil if the caller of r may read session's spills
	// and verdicts. session is a valid session id.
	Session(r *http.Request, session string) error
	// Operator returns nil if the caller of r may read every session (the
	// verdicts of all sessions at once).
	Operator(r *http.Request) error
}

// A denial of Access is answered with the status of the first error in its
// chain that has an HTTPStatus method (such as *Denial), or 403 if none
// has. A 401 gets a WWW-Authenticate: Bearer header. The error's text is
// the answer's detail: it should not say more than the caller may know.
type statusError interface {
	error
	HTTPStatus() int
}

// Denial is an error of Access carrying the status to answer: 401 (no or
// unknown credentials) or 403 (credentials that may not read this).
type Denial struct {
	Status  int
	Message string
}

func (d *Denial) Error() string { return d.Message }

// HTTPStatus is d.Status, or 403 when it is not a 4xx status.
func (d *Denial) HTTPStatus() int {
	if d.Status < 400 || d.Status > 499 {
		return http.StatusForbidden
	}
	return d.Status
}

// Deny returns a *Denial with status and a message.
func Deny(status int, format string, args ...any) error {
	return &Denial{Status: status, Message: fmt.Sprintf(format, args...)}
}

// statusOf is the status a denial is answered with.
func statusOf(err error) int {
	var se statusError
	if errors.As(err, &se) {
		if s := se.HTTPStatus(); s >= 400 && s <= 599 {
			return s
		}
	}
	return http.StatusForbidden
}

// Loopback is the Access of a gateway without credentials: a caller
// connected from a loopback address (127.0.0.0/8, ::1) may read
// everything, any other is denied with 403. The contract allows a
// listener without a token file only on a loopback address; Loopback
// holds to that whatever the listener. Behind a proxy on the same host
// every caller is on a loopback address: give such a gateway credentials.
type Loopback struct{}

// Session allows loopback callers.
func (Loopback) Session(r *http.Request, _ string) error { return loopback(r) }

// Operator allows loopback callers.
func (Loopback) Operator(r *http.Request) error { return loopback(r) }

func loopback(r *http.Request) error {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap().IsLoopback() {
		return nil
	}
	return Deny(http.StatusForbidden, "without credentials, only callers on a loopback address may read")
}
