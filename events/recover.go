package events

import "strings"

// The recover protocol: an agent reads the spills of its own session through
// the processor, which answers requests on Recover(session) (a NATS micro
// service, RecoverService, endpoint RecoverEndpoint, queue group
// RecoverQueueGroup). Agents have no JetStream API access, so they cannot
// read the object store themselves. processor/doc.go describes the protocol
// in full; the client package implements its caller (Session.Recover).
//
// A request is a RecoverRequest as JSON, at most MaxRecoverRequestBytes.
// An "info" request is answered with the named spill's handle (a
// SpillHandle as JSON); a "read" request with up to MaxRecoverChunk bytes of
// the object from Offset, the Header* headers saying what they are. Errors
// are micro's: the headers Nats-Service-Error (a message) and
// Nats-Service-Error-Code (400, 403, 404, 409, 413, 500 or 503) and an
// empty body.
const (
	// RecoverService is the micro service's name ($SRV.INFO.seamguard).
	RecoverService = "seamguard"
	// RecoverEndpoint is the name of its one endpoint.
	RecoverEndpoint = "recover"
	// RecoverQueueGroup is the queue group every processor instance
	// answers in: each request goes to one of them.
	RecoverQueueGroup = "seamguard"

	// RecoverOpInfo asks for a spill's handle; it is the default op.
	RecoverOpInfo = "info"
	// RecoverOpRead asks for a spill's bytes from an offset.
	RecoverOpRead = "read"

	// MaxRecoverRequestBytes bounds a request's body.
	MaxRecoverRequestBytes = 1 << 10
	// MaxRecoverNameBytes bounds a spill name in a request; a spill's name
	// is "<session>/<n>.jsonl", at most 155 bytes.
	MaxRecoverNameBytes = 256
	// MaxRecoverCursorBytes bounds a cursor in a request.
	MaxRecoverCursorBytes = 80
	// MaxRecoverChunk bounds the bytes of a spill one read reply carries
	// (less where the server's max_payload is small).
	MaxRecoverChunk = 512 << 10
	// MaxRecoverChain bounds the spills of a chain a caller follows, as the
	// spill package's DefaultMaxChain bounds the processor's own reads.
	MaxRecoverChain = 10_000

	// HeaderSpillName, HeaderSpillSize and HeaderSpillDigest describe the
	// whole object a reply is about: its name, size in bytes and digest
	// ("SHA-256=" and the URL-safe base64 of its SHA-256, as its handle).
	HeaderSpillName   = "Seamguard-Spill-Name"
	HeaderSpillSize   = "Seamguard-Spill-Size"
	HeaderSpillDigest = "Seamguard-Spill-Digest"
	// HeaderOffset is the offset in the object of a read reply's first
	// byte: the request's.
	HeaderOffset = "Seamguard-Offset"
	// HeaderCursor is what the next read request should send as its
	// Cursor, with Offset = HeaderOffset + the body's length; absent when
	// the reply reaches the object's end.
	HeaderCursor = "Seamguard-Cursor"
)

// RecoverRequest is the body of a request to the recover service.
type RecoverRequest struct {
	// Op is RecoverOpInfo (the default when empty) or RecoverOpRead.
	Op string `json:"op,omitempty"`
	// Name is the spill's object name, from its handle: a spill of the
	// session the request's subject names ("<session>/...").
	Name string `json:"name"`
	// Offset is, for a read, the offset in the object of the first byte
	// wanted; at most the object's size.
	Offset uint64 `json:"offset,omitempty"`
	// Cursor is, for a read, the HeaderCursor of the reply that ended at
	// Offset; opaque. Without it the service finds Offset by reading the
	// object from its start, which is slower for a large spill.
	Cursor string `json:"cursor,omitempty"`
	// Max is, for a read, the most bytes wanted; 0 means MaxRecoverChunk,
	// more is taken as MaxRecoverChunk.
	Max int `json:"max,omitempty"`
}

// Recover is the subject of the recover service for session's spills:
// "<prefix>.recover.<session>". A deployment can grant an agent only its
// own sessions' subjects.
func (s Subjects) Recover(session string) string {
	return s.prefix() + ".recover." + session
}

// RecoverWildcard matches the recover subjects of every session: what the
// service subscribes to.
func (s Subjects) RecoverWildcard() string {
	return s.prefix() + ".recover.*"
}

// RecoverSession returns the session token of a recover subject, and
// whether natsSubject is one with a valid session id.
func (s Subjects) RecoverSession(natsSubject string) (string, bool) {
	tok, ok := strings.CutPrefix(natsSubject, s.prefix()+".recover.")
	if !ok || !ValidSessionID(tok) {
		return "", false
	}
	return tok, true
}
