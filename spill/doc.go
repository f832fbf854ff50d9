// Package spill writes a session's transcript losslessly and reads it back.
//
// A spill is JSON Lines: accepted input events of one session, in order,
// one structured CloudEvent a line whatever content mode it arrived in.
// A session's first spill holds its events from its session.opened to the
// compaction request that asked for the spill; each later one holds only
// the events after the previous spill's last, up to its own request
// (ledger.SpillRequest: FirstSeq, LastSeq, Events, Previous). The spills
// of a session form a chain through their previous spill: read together,
// oldest first, they are every accepted event of the session up to the
// newest spill's request. A handle describes its object alone (digest,
// size, events, first and last stream sequence), names the previous spill
// (nil for the first) and carries the range [0, head) the chain makes
// recoverable. Digests are the JetStream object store's ("SHA-256=" and the
// URL-safe base64 of the SHA-256 sum), so a handle verifies the same way
// whether the spill sits in the object store or, for the offline `check`
// command, in a directory (Dir).
//
// Writer hashes and counts as it writes and never holds more than one event
// and a 64 KiB buffer; it refuses a line that would take it past a byte
// limit (a session's spill quota) with ErrQuota. A Writer is used by one
// goroutine.
//
// # Which events, and the replay's state
//
// Which events go in is not guessed from the stream: the session's events
// are replayed through a shadow ledger.Ledger with ledger.Step (under
// Store.Ledger, the processor's settings, whose limits decide acceptance),
// and exactly those Step accepts are written, as the live processor
// accepted them (rejected and duplicate events are left out; events that do
// not decode were rejected). A spill request the shadow makes is answered
// as the processor's was: the spills of the chain succeeded, any other
// failed (the spill after it would otherwise name it as its previous), and
// the request at LastSeq, this spill, is answered with its own handle once
// it is written.
//
// For a later spill the shadow needs the session's state where the
// previous spill ended. Each spill stores the shadow's snapshot (ledger
// MarshalBinary, bounded by the ledger's limits) as chunks of their own
// on $O.<bucket>.C.<nuid>, named with their count, size, digest and stream
// sequence in the object's metadata (seamguard-state-*). The next spill of
// the chain restores it from the object its request names as previous and
// replays only the events after that spill. When the state is missing or
// unusable (the previous spill was deleted, written by an older seamguard,
// its state chunks lost, corrupt, or of another sequence), Write replays
// the session from its first event instead (the FirstSeq of the chain's
// first spill, found by following the previous spills back, or else the
// session's oldest event in the stream), reads but does not write the
// events before FirstSeq, and stores the state it reached: the result is
// the same, only slower, and incomplete if those events are gone.
//
// # The object store
//
// Store writes a spill into a JetStream object store bucket, answering a
// ledger.SpillRequest. It reads the session's events back from the events
// stream with an ordered consumer and writes the accepted ones from
// FirstSeq to LastSeq straight into the object's chunks (512 KiB each by
// default, see Store.ChunkSize). A goroutine of its own hashes and
// publishes each chunk as it fills, with at most eight awaiting their acks,
// while the next events are read; no transcript is ever held in memory: a
// spill of any size raises the client's heap by about 16 MiB at its peak
// (at most eleven chunks and the garbage collector's slack), plus the
// shadow ledger's snapshot.
//
// The object is laid out exactly as the object store's own Put lays it out
// (chunks on $O.<bucket>.C.<nuid>, the info, a rollup, on
// $O.<bucket>.M.<encoded name>), so nats.go, the nats CLI and Get read it
// alike. Unlike nats.go's Put, Write publishes the info only once every
// chunk (and the state's) is acknowledged: a chunk the bucket refuses late
// (a full bucket) never leaves an info that names chunks the stream does
// not hold, and the chunks of a failed or cancelled attempt are purged.
// Replacing a name's object purges the old version's chunks and state.
// Write stores the handle's fields, previous included, as object metadata,
// so HandleOf rebuilds a handle from Info alone. Get reads one object;
// GetChain reads a spill's whole chain, oldest first, after following
// and checking its links (same session, in order, no loop, at most
// MaxChain spills; else ErrChain). Both read the object's chunks with
// batched direct gets (package jsread), a few MiB a request and no
// consumer, instead of nats.go's ObjectStore.Get, whose push consumer lets
// up to 32 MB queue in the client and which allows 5 seconds for the whole
// object when the context has no deadline; each verifies size, chunk count
// and digest
// (ErrDigestMismatch). After the put, the stored object info must name the
// size and digest written; with Verify, the object is also read back whole.
//
// # Failures
//
//   - ErrIncomplete, at once: the stream no longer holds an event the
//     spill needs (the session's first, for a chain's first spill or a
//     replay from the start; the request at LastSeq), the first event read
//     is not the one expected, the consumer passes LastSeq before reaching
//     it, or the accepted events read differ in number from the request's
//     count (an event in between was deleted). The check happens before the
//     last chunk is sent, so an incomplete transcript never becomes an
//     object. A stream's answer that it holds no message at a sequence is
//     taken as the event being gone only when the stream's leader shows it
//     has applied that sequence (its state ends there or later), then
//     still finds nothing there, and is the same leader afterwards: a
//     leader elected a moment ago answers before it has applied its log,
//     and that is ErrUnavailable, for a later attempt. What the transcript's
//     reader (a consumer, which may sit on a replica still catching up)
//     finds missing is checked the same way with the leader: the event
//     expected first or last, or, for a count that differs, every sequence
//     of the session's events in the range (STREAM.MSG.GET), which must be
//     the ones the reader delivered. Only when the leader agrees is the
//     transcript incomplete; otherwise ErrUnavailable.
//   - ErrUnavailable: the transcript cannot be read now, though nothing
//     shows it is gone: the above, an events stream that is not found (an
//     operator deleted it, or a cluster's meta leader does not know it yet
//     after a restart), or a consumer that failed (its server went away
//     and it could not be made again).
//   - ErrQuota (also ErrPermanent), at once: the spill would exceed
//     SpillRequest.MaxBytes, what is left of the session's spill quota.
//   - ErrStorageFull (also ErrPermanent), at once: JetStream refused a
//     chunk, the state, the info or the write's registration for want of
//     storage: the bucket at its MaxBytes (a DiscardNew stream answers
//     10077 "maximum bytes exceeded" or "maximum messages exceeded"), or the
//     server or account out of resources (10023, 10002, 10028, 10047).
//     The bucket discards new data, so it never evicts a spill it holds.
//   - ErrPermanent, at once: a bad request, a message over the server's or
//     the stream's size limit (nats.ErrMaxPayload, 10054, 10077 "message
//     too large"), a permission the connection lacks (a publish the server
//     refuses for permissions is never acknowledged; a timeout while the
//     connection's last error is such a refusal on the bucket's subjects is
//     taken as one).
//   - ErrUnavailable: the stream cannot yield the transcript now although
//     nothing shows it is gone (a lagging replica, a new leader); retried.
//   - Anything else (opening the bucket, a put or an ack failing or timing
//     out, a stream that stalls for 10 seconds, a digest that does not
//     match, a registration that lapsed) is retried Retries times, Backoff
//     apart and doubling up to 30 seconds, and the last error is returned.
//
// In every case the attempt's chunks and state are purged before Write
// returns. Cancelling ctx ends Write promptly, also during a backoff.
//
// # Writes in progress, and orphaned chunks
//
// A writer killed mid-spill (kill -9, a lost node) leaves chunks that no
// info names. So that they can be told from the chunks of a write still
// running on another instance, every attempt registers itself before its
// first chunk: a message on $O.<bucket>.C.<nuid>.writing (a subject the
// object store never reads) naming the spill and the chunk subjects it
// fills, republished every DefaultRenewal (a rollup keeps one message)
// and purged once the info is stored or the attempt's chunks are purged.
// A writer that could not renew its registration for half of
// DefaultRegistrationTTL gives the attempt up before storing the info.
//
// SweepOrphans lists the bucket's chunk subjects, then the registrations,
// then the infos, in that order (a write registers before its first chunk
// and unregisters only after its info is stored, so a subject listed first
// is named by one of the two later reads unless it is truly orphaned), and
// purges the chunk subjects that no info names (as its chunks or its
// state), no live registration (renewed within DefaultRegistrationTTL)
// names, and whose newest chunk is at least minAge old; it removes stale
// registrations too. minAge also keeps the chunks of writers that register
// nothing (nats.go's Put). Ages compare the server's timestamps with the
// local clock. A process runs it at start and then every few minutes:
//
//	rep, err := store.SweepOrphans(ctx, 10*time.Minute)
//
// # Every loop ends
//
//   - Write's attempts: at most Retries, each wait at most 30 seconds, and
//     ctx; ErrIncomplete, ErrPermanent (ErrQuota, ErrStorageFull) and ctx
//     errors end it at once.
//   - Reading the transcript (produce): each pass reads one message at a
//     higher stream sequence, and the loop ends at LastSeq; each wait for a
//     message is at most 10 seconds (readIdle), then the stream is asked
//     whether the end is gone (ErrIncomplete) or the attempt fails
//     (ErrUnavailable). The ordered consumer resets at most 3 times.
//   - Asking the leader about what the reader found missing: one or two
//     gets and two stream infos, or for a count that differs one pass over
//     the session's messages from where the replay starts to LastSeq, at
//     most one request in flight per subject, each answer awaited at most
//     10 seconds.
//   - Reading an object (read): at most its info's chunk count, each wait
//     for an answer at most 10 seconds.
//   - Following a chain (GetChain, and Write's walk back): each step visits
//     a name not seen before, at most MaxChain of them.
//   - Sending chunks (objectWriter): each ack awaited at most 10 seconds
//     (ackWait), at most eight in flight; abandoning waits at most 10
//     seconds in all for those still in flight.
//   - The registration's renewals: until the attempt ends or ctx is done.
//   - SweepOrphans: one pass over the subjects listed once; each request
//     waits at most 30 seconds.
//
// A Store's methods may be called from any number of goroutines, also for
// the same name (the last put wins; each verifies what it wrote).
package spill
