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
//
// # The object store
//
// Store writes a spill into a JetStream object store bucket, answering a
// ledger.SpillRequest. It reads the session's events back from the events
// stream with an ordered consumer, from the request's FirstSeq to its
// LastSeq, and writes them straight into the object's chunks (512 KiB each
// by default, see Store.ChunkSize). A goroutine of its own hashes and
// publishes each chunk as it fills, with at most eight awaiting their acks,
// while the next events are read; no transcript is ever held in memory: a
// spill of any size raises the client's heap by about 16 MiB at its peak
// (at most eleven chunks and the garbage collector's slack). Which events
// go in is not guessed from the stream: every event that decodes is
// replayed through a shadow ledger.Ledger with ledger.Step, and exactly
// those Step accepts are written, as the live processor accepted them (rejected and duplicate
// events are left out; events that do not decode were rejected). Where the
// shadow asks for a spill of its own it is told the spill failed: that
// halts the shadow session, which changes what it answers to compactions
// but never which events it accepts.
//
// The object is laid out exactly as the object store's own Put lays it out
// (chunks on $O.<bucket>.C.<nuid>, the info, a rollup, on
// $O.<bucket>.M.<encoded name>), so nats.go, the nats CLI and Get read it
// alike. Unlike nats.go's Put, Write publishes the info only once every
// chunk is acknowledged: a chunk the bucket refuses late (a full bucket)
// never leaves an info that names chunks the stream does not hold, and the
// chunks of a failed or cancelled attempt are purged.
//
// A transcript is incomplete, and Write returns an error wrapping
// ErrIncomplete without retrying, when the stream no longer holds the
// session's first event or the request at LastSeq (aged out, purged or
// deleted), when the first event read is not at FirstSeq, when the
// consumer runs dry or passes LastSeq before reaching it, or when the
// number of accepted events read differs from the request's count (an event
// in between was deleted). The check happens before the last chunk is sent,
// so an incomplete transcript never becomes an object. Every other failure
// (opening the bucket, a put or an ack failing or timing out, a stream that
// stalls for 10 seconds, a digest that does not match) is retried Retries
// times, Backoff apart and doubling, and the last error is returned.
// Cancelling ctx ends Write promptly, also during a backoff; chunks a
// cancelled put had sent are purged.
//
// After the put, the stored object info must name the size and digest
// written. With Verify, the object is
// also read back whole and hashed. Get and that read-back use an ordered
// pull consumer on the object's chunks that buffers at most 16 of them,
// instead of nats.go's ObjectStore.Get, whose push consumer lets up to 32 MB
// queue in the client and which allows 5 seconds for the whole object when
// the context has no deadline. Write stores the handle's fields as object
// metadata, so HandleOf rebuilds a handle from Info alone.
//
// A Store's methods may be called from any number of goroutines.
package spill
