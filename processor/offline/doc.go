// Package offline decides a file of session events without any server: the
// `seamguard check` command. It runs the same pure core (package ledger) as
// the JetStream runtime, one ledger per session, and writes the same output
// events, so a story can be checked, diffed and kept as a golden file.
//
// Offline, the stream sequence of an event is its line number (blank lines
// count but produce nothing), so spill handles name line numbers in
// first_seq and last_seq. Accepted events are journaled to a temporary file,
// one line each, and a spill copies the session's lines from first_seq to
// last_seq from it into <SpillDir>/<session>/<n>.jsonl, with its handle
// beside it in <n>.jsonl.handle.json (spill.Dir): the object name, format
// and digest the object store would have, and the chain a later spill
// continues. Handles name the bucket seamguard-spills unless Runner.Bucket
// says otherwise. Memory holds the ledgers and 24 bytes per accepted event,
// never the transcripts.
//
// A file is the operator's own input: a session.resumed line in it counts as
// arriving on the session's control subject (the processor accepts a resume
// only there; see events.Subjects.Control).
//
// A Runner is used by one goroutine.
package offline
