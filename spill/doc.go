// Package spill writes a session's transcript losslessly and reads it back.
//
// A spill is JSON Lines: every accepted input event of the session, from its
// session.opened to the compaction request that asked for the spill, in
// order, one structured CloudEvent a line whatever content mode it arrived in.
// Its digest is the one the JetStream object store gives ("SHA-256=" and the
// URL-safe base64 of the SHA-256 sum), so a handle verifies the same way
// whether the spill sits in the object store or, for the offline `check`
// command, in a directory (Dir).
//
// Writer hashes and counts as it writes and never holds more than one event
// and a 64 KiB buffer. A Writer is used by one goroutine.
package spill
