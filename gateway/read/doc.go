// Package read serves the two read endpoints of seamguard's CloudEvents
// HTTP interface (docs/http.md):
//
//   - GET /v1/sessions/{session}/spills/{n}: the whole chain of spill
//     <session>/<n>.jsonl as JSON Lines, the same bytes `seamguard spill
//     get` writes (both call spill.Store.GetChain), with its SHA-256 in a
//     Digest and a Repr-Digest header.
//   - GET /v1/verdicts?session=&kind=&from=: verdicts as Server-Sent
//     Events, each a structured CloudEvent (the bytes the verdict stream
//     holds) with its stream sequence as the event id, resumable with
//     Last-Event-ID.
//
// The package decides nothing about who may read what: a Handler asks its
// Access, which the HTTP gateway implements with its bearer tokens (or
// Loopback, for a listener on a loopback address without a token file).
// Reading one session needs Access.Session; the verdicts of every
// session, Access.Operator. Every request is checked for well-formed
// input (a session id of [A-Za-z0-9_-]{1,128}, a spill number, a known
// kind) before Access is asked, and Access is asked before anything is
// looked up, so a caller denied a session cannot learn whether it exists.
//
// # Spills
//
// The object name is built from validated parts only ("<session>/<n>.jsonl"),
// and the spill's metadata must name the session too. The Digest is of
// the bytes served, the chain's concatenation, so it equals the handle's
// digest for a chain of one spill only. Since headers precede the body, a
// chain whose digest is not known yet is read twice: once into the hash,
// verifying each object, then to the client; the digest of each chain
// (keyed by the name, size and digest of each of its spills) is kept
// afterwards, so later reads read it once. Nothing is held in memory but
// a chunk at a time. If the second read fails or differs from the first,
// the connection is aborted: with Content-Length set, the client sees a
// short body rather than a wrong one.
//
// # Verdicts
//
// The verdict stream is read the way `seamguard watch` reads it (package
// internal/jsread): batched direct gets answered to the gateway's own
// inbox, woken by a core subscription to the verdict subjects, so a
// client costs the server no consumer, durable or ephemeral, and a client
// that goes away leaves nothing behind. The subject filter carries the
// session and a single kind; several kinds are filtered by the handler.
//
// Each verdict's signature is verified as watch verifies it
// (attest.Verifier, trusting Config.Trust). One that fails is not sent as
// a verdict: it comes as an event of type "unverified" whose data names
// the reason, the subject and what the message claims, so a client that
// listens for verdict types never mistakes it for one, and one that
// listens for "unverified" can report it, as watch reports UNATTRIBUTED.
//
// # Concurrency
//
// A Handler is safe for concurrent use. Config.MaxStreams bounds the open
// event streams, Config.SessionStreams those of one session (so one
// session's readers cannot take them all), and Config.MaxSpillReads the
// spill reads in flight; a request beyond any is answered 503 with
// Retry-After. Close ends the open event streams, which would otherwise
// hold http.Server.Shutdown until their clients leave.
package read
