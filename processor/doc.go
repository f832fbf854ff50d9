// Package processor is seamguard's keyed stream processor on NATS JetStream:
// all the I/O around the pure core of package ledger.
//
// Provision creates (or checks and updates) the events stream, the verdict
// stream, the session bucket, the spill object store and the leases bucket.
// A Processor then consumes the events stream with one durable pull
// consumer per partition (and one for events whose subject names no
// session), fetching in batches. The stream stores a session's events and
// its control inputs in its partition (events.Subjects), so that each
// partition's consumer has a single filter: measured on one server, a
// consumer with a second filter (the control subjects kept apart) read the
// stream about three times slower. A dispatcher hashes each message's subject to one of a fixed set of
// shards; each shard is one goroutine with a bounded queue that owns its
// sessions' ledgers outright (no locks, per-session order, no goroutine per
// message).
//
// A shard works in group commits. For a batch of messages it decodes each,
// Steps the session's ledger, writes the spill the ledger asks for (and
// Steps its result), and publishes every output with Nats-Msg-Id set to the
// output's deterministic id, signed with Config.SigningKey (the
// Seamguard-Signer and Seamguard-Signature headers over the body; see
// package attest: deterministic, so a verdict published again is the same
// message). Then it waits for every publish ack, stores each
// touched session's state once (ledger snapshot plus the last applied stream
// sequence, compare-and-swap on the bucket revision), and only then marks the
// batch's inputs finished.
//
// The states' writes of one batch overlap the next batch: while they are
// stored, the shard decides its next batch from the sessions in memory and
// publishes its verdicts, and then settles the pending batch (each state
// stored, or sorted out on its own, and the inputs finished) before it
// sends the next batch's states. So an input is acknowledged only once its
// own batch's state is stored, and a session's states are stored in order.
// A session the settle loses to another writer is left by the next batch
// too (its inputs wait for the session's owner, as any fenced batch's do).
// Whatever may have let another writer in, a new lease of the partition or
// a break in delivery, settles the pending batch before the session is
// used, and the session is read again from the bucket. A batch that leaves
// a session undecided records the highest of its inputs there at once, not
// when it is settled: the next batch, decided meanwhile, may read the
// session again, and catches it up past those inputs before it decides a
// newer one (else they would be skipped as applied when they come back).
//
// The batch's verdicts go to the verdict stream, and then its states to
// the session bucket, each through the processor's writer of that kind
// (group.go): while a writer writes one group, the writes of every shard
// wait, and the next group is all of them, written as one JetStream atomic
// batch (batch.go; Provision allows atomic publishes on both streams). A
// shard's batch alone seldom holds enough writes for a batch: at 100 busy
// sessions over 8 shards it touches three or four. A server that syncs
// every write stores an atomic batch with one fsync, where separate
// messages cost one fsync each, in series per stream: that fsync is what a
// durable server spends most of its time on, so writing fewer, larger
// batches is what makes the durable default fast. An atomic batch is all or
// nothing: every compare-and-swap and every dedupe check in it must pass.
// One that does not commit (a session another instance moved on, a verdict
// stored before, a reply lost) stores nothing, and its messages are then
// written one at a time, each sorted out on its own as above. The same
// inputs therefore give the same verdicts and states either way
// (Config.NoAtomicBatches writes every message on its own). A batch costs
// the server a staging store besides its fsync, so a group of fewer than
// 16 writes goes one at a time, pipelined. Measured side by side on one
// server that syncs every write: at a million live sessions and one event
// each, groups of about 600 states decide 2.3 to 5 times as many events a
// second as writes one by one, about as many as the same processor on a lazy
// server, and reading the states and looking up the events stream then
// bound it; at 100 busy sessions, groups of about 40 writes where a shard
// alone had 3 or 4 (docs/performance.md, "Durable writes"). A changelog of
// states (one fenced message per partition for a group's states, the
// bucket written behind it) is not used: measured as its cheapest form,
// each group's states in one message and no bucket write at all, it raised
// the 1 KiB ingest rate by about 0.1 of the raw consumer's, which is bound
// by CPU per event, not by writes; at a million sessions the reads bound
// the rate (docs/performance.md, "What bounds ingest"). The bucket's
// per-session compare-and-swap stays what fences a stale writer.
//
// Rejected inputs are terminated with their rejection
// code as the reason, after their event.rejected verdict is durable, so a
// poison message is never redelivered.
//
// A partition's consumer acknowledges with AckAll: one ack of a stream
// sequence acknowledges every input of the partition up to it, which spares
// the broker most of what it spends per message. Since shards finish inputs
// in any order, each consumer has an ack window that sends an ack only for
// the longest prefix of finished inputs, through the last one delivered
// here (a termination acknowledges what precedes it too, so a rejected input
// is terminated when the prefix reaches it). The window must know every
// input the server holds pending for the consumer: on a break in delivery,
// or at the start with inputs pending, the processor lists those delivered
// elsewhere from the stream, holds them in the window, and sends each of
// their sessions a marker that makes its shard catch it up from the stream
// past them; they are finished once stored. Until a later delivery here is
// acknowledged, the server counts them pending and redelivers them at their
// deadline, which the stored sequence then skips. The consumer of events
// that name no session acknowledges each input on its own.
//
// Redelivery is harmless: an input at or below the stored sequence is acked
// without being applied again, and an input whose effects were cut short by a
// crash is stepped again from the stored state, which gives the same outputs
// under the same ids, which the verdict stream's dedupe window drops.
// JetStream redelivers an unacknowledged message only after its ack
// deadline, so after a crash or a lost delivery (a break in the consumer's
// delivery sequence) later messages of its session may arrive first. Up to
// the highest sequence that may be affected, each session first reads its
// messages from the stream and applies them in order; their late
// redeliveries are then skipped.
// The ack deadline is extended while a spill runs.
//
// # Files
//
// An input goes through the files in this order: package events decodes it,
// then
//
//   - fetch.go: a partition's fetcher, its lease and its ack window, the
//     routing of each input to its session's shard;
//   - shard.go: a shard's goroutine, its sessions in memory, and what it
//     left undecided;
//   - round.go: one batch of a shard, from the decisions to the acks: each
//     input routed and decided, the outputs published, the touched
//     sessions stored, the inputs finished; and the sessions it leaves;
//   - prefetch.go, multiget.go, direct.go, reads.go, probe.go: the batch's state
//     reads (many keys a request), each session's first catch-up lookup
//     as a direct get (pipelined), and the other lookups
//     (a message's position alone unless a catch-up may apply it), made
//     before the batch begins, on connections kept for reads;
//   - sessions.go: loading a session's state, the lease check, storing with
//     compare-and-swap;
//   - catchup.go: applying from the stream what was delivered elsewhere or
//     left, or what a state just read is behind;
//   - floor.go: the partitions' floors, stored in the bucket with the
//     states, which show most states read fresh caught up, so that their
//     catch-up's lookups are not made;
//   - step.go: one decision (package ledger's Step) and the spill it asks
//     for (package spill);
//   - publish.go: publishing verdicts and confirming their acks;
//   - group.go, batch.go: the writers that gather every shard's verdicts
//     and states into groups, and the atomic batches they write;
//   - ackwindow.go, lease.go: the ack window and the partition leases;
//   - retry.go: which failures are waited out, and for how long;
//   - stores.go: the watch over the streams behind every store, which
//     makes the processor unready while one is missing.
//
// runtime.go starts and stops it all (New, Run); provision.go makes the
// streams and buckets, rebuild.go rebuilds state from the events stream,
// recover.go serves agents their spills, service.go is how any service of
// the processor answers (inboxes only, fair queues), state.go is the
// bucket's format.
//
// # Hand-overs
//
// A partition is consumed by the instance holding its lease (see leases).
// Every decision is made from a complete, current state: a session read
// under an earlier lease of its partition (an epoch counts the takes) is
// read from the bucket again before its next decision, since the holder in
// between may have moved it on; and a delivery is decided only while the
// lease it was fetched under is still held, with a tenth of the TTL to
// spare before its key could expire. A process that was paused or cut off
// past its lease therefore leaves what it had fetched to the partition's
// holder. A decision made while the lease was current is the one any later
// holder makes from the same inputs, under the same id, so a verdict
// published late is dropped by the verdict stream's dedupe window.
//
// A rebuild (Rebuild, serve --rebuild) is a holder of every partition at
// once: before it reads anything it takes every partition's key, as an
// instance named "rebuild-<host>-<pid>-<random>", renews them every
// LeaseTTL/4 and writes only while they are current, and deletes them when
// it returns, so that the Run that follows (or any instance) takes them at
// once. Instances running meanwhile find the keys held and consume
// nothing. A key another instance holds is watched for up to the lease TTL
// (and a quarter): renewed, its holder is live, and the rebuild refuses at
// once with a LeasesHeldError naming each holder, its partitions and its
// last renewal, having read and written nothing; not renewed (a killed
// holder), it expires and is taken. A rebuild publishes a missing verdict
// only under its id: one the stream reports as a duplicate is stored
// already, or was deleted within the dedupe window and is reported
// (RebuildReport.Withheld), never published again without its id.
//
// # Failures and retries
//
// Every loop that retries ends. A failure is either transient (NATS or
// JetStream did not answer: a timeout, no responders, a connection being
// re-established, a leader moving) or permanent (retrying cannot fix it: a
// message over the server's max payload, a permission denied, storage or an
// account's resources exhausted, a value over the bucket's or stream's
// limit; see spill.Permanent). The loops, and what ends each:
//
//   - a shard's effects: reading a session's state, reading its messages for
//     a catch-up, publishing a verdict and waiting for its ack, storing the
//     state, checking the state before a spill's failure is believed. A
//     permanent failure is not retried. A transient one is retried with
//     backoff (50ms doubling to 2s) within the batch's budget, RetryFor
//     (30s by default) from the batch's first failure, shared by all its
//     loops. Either way the session is then left stuck: nothing more of it
//     is published or stored in that batch, its inputs stay unacknowledged
//     and are redelivered after the ack deadline, when it is tried again
//     from its stored state (what it published stands; the same inputs
//     publish the same verdicts under the same ids). The other sessions of
//     the batch, the shard, and the partition go on. While any session is
//     stuck, Ready reports it (ErrNotReady, naming the session and the
//     error), the Observer is told (a gauge in package metrics), and an
//     error is logged; the first input of the session finished later
//     clears it. A stuck session's unacknowledged inputs hold back the
//     acknowledgements of its partition (not its decisions): the inputs
//     after them are redelivered at their deadline and skipped, and past
//     MaxAckPending the partition waits for them. A session stuck for
//     ParkAfter on a permanent failure is therefore parked (park.go): a
//     record in the session bucket, its inputs acknowledged into it and
//     left in the events stream until an operator's control input applies
//     them.
//   - a spill: the object store's own retries (package spill, bounded in
//     count); NATS not answering, or a JetStream cluster that cannot serve
//     for a moment (temporarily unavailable, not the leader, a stream
//     offline: a leader election), within the batch's budget as above;
//     other failures up to 4 attempts over at least 10 seconds, then the
//     session halts (rule 5). A spill
//     that runs out of storage, the bucket's size or the session's quota
//     halts the session at once. A spill's outcome, failure or success,
//     counts only while the partition's lease its input was fetched under
//     is still this instance's, and a failure only while the session's
//     stored state is still the one read; the lease is checked again
//     before the round publishes the outcome. A spill (or a round) that
//     outlasted the lease may have been decided meanwhile by the
//     partition's next holder, and the session is left to it (fenced)
//     instead.
//   - a partition's fetches, and reading its consumer's state on a takeover
//     or a break in delivery: retried with backoff until Run ends; from the
//     third failure in a row the consumer is reported by Ready until a fetch
//     succeeds.
//   - the leases: one attempt of each write a round (every LeaseTTL/4); a
//     round that cannot reach the bucket makes Ready report it until one
//     can.
//   - a drain: at most DrainTimeout (25s by default) from the cancellation,
//     then Run stops as Abort does (what it had not finished is
//     redelivered to the next owner) and still hands its partitions over.
//   - Rebuild: the same classification with the RetryFor budget, then it
//     fails as a whole.
//   - the recover service: none. Each request gets one answer, after at
//     most 5 seconds of work; a JetStream that does not answer is a 503,
//     and the caller decides whether to ask again (package client asks at
//     most 5 times).
//
// # Memory
//
// A shard keeps the ledgers of the sessions it stepped lately in memory,
// idles the others into their snapshots, and past its share of MaxSessions
// drops idle sessions from memory altogether (their state is in the bucket,
// and they are read again, and caught up from the stream, when next used).
// Memory is bounded by MaxSessions, not by the sessions ever opened.
//
// Where several instances run, each consumes only the partitions whose
// lease it holds (lease.go): a key per partition in the leases bucket,
// created when free, renewed by compare-and-swap every TTL/4, and left to
// expire (the bucket's age limit is the TTL) by an instance that died. Each
// instance announces itself there too and takes its fair share of the
// partitions, as many creates at once as the share lacks (on a server that
// syncs every write each is an fsync, and a start would otherwise wait for
// them one after another; the consumers it updates are updated at once
// too, and only those the server holds configured otherwise than this
// instance would configure them, as an update stores the configuration
// again even unchanged); one that holds more hands the surplus over once the fetch
// under way has ended, and a drain hands everything over. A fetch waits for
// messages only until shortly before its lease could expire, so the server
// sends nothing to an instance that may have lost the partition.
//
// Ownership moves (a partition changing hands, a lost delivery, a crash)
// show as a break in an instance's delivery sequence. After one, a session
// is read again from the bucket before it is used, and catches up from the
// stream: the messages after its stored sequence that were delivered
// elsewhere and not acknowledged are applied in order, ahead of their
// redelivery, which is then skipped. The catch-up's lookups are answered by
// the events stream's leader; one elected a moment ago may answer before it
// has applied its log, and answer that nothing follows the stored sequence
// although messages up to the catch-up's limit (the input at hand, the
// horizon, a marker's inputs) are stored there. Such an answer is not
// trusted: a catch-up that finds nothing more short of its limit waits
// until the stream's state shows the limit applied and asks again (a
// message found past the limit proves it already, since a leader applies
// its log in order). The prefetch sends each session's first lookup
// as a direct get, which any replica may answer, and takes only an answer
// holding a message of the session's subject: a replica that holds
// sequence m has applied all before it, so the first message it finds is
// the first there is; "nothing" is asked of the leader. With more than
// one replica of the events stream every lookup asks the leader: a replica
// restarted with entries its leader never committed answers from those
// until it has caught up. Direct gets that
// go unanswered (an identity without the permission, a stream without
// allow_direct, a server away) are off for a minute, every lookup asked of
// the leader, and then tried again. The bucket's compare-and-swap is the
// fence: an instance that lost a session and still writes gets a revision
// mismatch, drops the session and leaves its inputs unacknowledged for the
// owner. Because a decision depends only on the session's inputs in stream
// order, whatever either instance published is what the other publishes,
// under the same ids.
//
// A session read fresh is caught up this way unless its partition's floor
// shows there is nothing to catch up (floor.go): a key of the session
// bucket, floor.<partitions>.<partition>, that the states' writer stores
// in its atomic batches, saying up to which input of the partition every
// input is finished and in the states stored before it. Read in the same
// request as the states, with the sessions' park records, it spares a
// fleet's batch one lookup in the events stream per session: at a million
// live sessions, where nearly every input is a session read fresh, the
// processor decided 10,300 to 10,700 events a second with floors against
// 7,500 to 7,900 without, on the same machine (docs/performance.md). A
// floor is taken only as far as this instance's unbroken delivery reaches
// back, only for states a processor stored and no park record followed,
// and not at all once the bucket's log is seen going back.
//
// # Recovering spills: the recover service
//
// Agents have no JetStream API access, so they cannot read the spill a
// refusal hands them. Every instance runs, while Run runs, a service in the
// NATS micro protocol through which an agent reads the spills of its own
// sessions, on the responder connection (WithResponder; the processor's
// own by default): name "seamguard", version ServiceVersion, one
// endpoint "recover" on <prefix>.recover.* in the queue group "seamguard",
// so that each request goes to one instance. `nats micro ls`, `nats micro
// info seamguard` and `nats micro stats seamguard` find it ($SRV.PING,
// $SRV.INFO.seamguard, $SRV.STATS.seamguard). It stops when a drain
// begins: the request being answered is answered, those still queued get
// 503. Config.NoRecoverService turns it off. The service keeps no state
// between requests, so any instance may answer any of them.
//
// The protocol (its names are in package events, recover.go):
//
//   - Subject: <prefix>.recover.<session>, a core NATS request. The
//     session token is the authority: a request may name only spills of
//     that session, so a deployment can grant an agent publish on its own
//     sessions' subjects alone.
//   - Request: a JSON object of at most 1 KiB,
//     {"op":"info"|"read","name":"<session>/<n>.jsonl","offset":0,"cursor":"","max":0}.
//     name is the spill handle's name (at most 256 bytes).
//   - info (the default op) answers the spill's handle as its body: the
//     events.SpillHandle JSON of the verdicts, rebuilt from the object's
//     info, whose previous names the spill before it (null for the first).
//   - read answers up to max bytes (0 and anything larger mean 512 KiB;
//     less when the server's max_payload is small) of the object from
//     offset. Headers: Seamguard-Spill-Name, Seamguard-Spill-Size and
//     Seamguard-Spill-Digest describe the whole object; Seamguard-Offset
//     is the offset of the body's first byte; Seamguard-Cursor, absent at
//     the object's end, is what the next read sends as its cursor, with
//     offset plus the body's length as its offset. A read at the end
//     answers an empty body. The cursor names the object's version (a
//     name written again has another), and the stream sequence and offset
//     of the chunk holding the next byte. A spill's writer records where
//     each of its chunks is (package spill, ChunkIndex), so a read at any
//     offset, with or without a cursor, is one direct get of the chunk
//     holding it; a spill without that record is read chunk by chunk from
//     its first up to offset.
//   - Every request gets exactly one reply, of at most 512 KiB of data
//     plus headers: no flow control is needed, and a lost reply is asked
//     for again.
//   - Refusals carry micro's headers Nats-Service-Error (what is wrong,
//     naming the spill) and Nats-Service-Error-Code, and no body:
//     400 a malformed request (not JSON, no name, a name over 256 bytes,
//     an unknown op, a negative max, an offset past the end, a cursor the
//     service did not give or that does not fit the offset); 403 a name
//     that is not a spill of the subject's session (checked on the name
//     before anything is read, then on the object's own metadata); 404 no
//     spill of that name, or an object that is not a spill; 409 the cursor
//     is of another version of the object (written again: when its size
//     and digest are the handle's it is the same transcript, read on
//     without the cursor); 413 a request over 1 KiB; 500 a damaged object
//     (its chunks hold fewer or more bytes than its info says) or another
//     JetStream failure; 503 JetStream did not answer, or the instance is
//     stopping: ask again.
//
// A caller reads a spill's chain as spill.Store.GetChain does: info for
// the handle's name, then for each previous spill back to the first,
// checking the links (no name twice, each spill's last_seq before the next
// one's first_seq, at most 10,000 spills), then each object oldest first
// from offset 0, following the cursors, and checks each object's size and
// SHA-256 against its handle's digest ("SHA-256=" and the URL-safe base64
// of the sum, padded: decode it rather than compare strings). The
// objects' bytes together are the session's accepted events, JSON Lines,
// from its first to the newest spill's request. Package client does all
// this in Session.Recover.
//
// Bounds: a request is at most 1 KiB, a name 256 bytes, a cursor 80 bytes,
// a reply 512 KiB of data; each request gets at most 5 seconds of work (an
// object info and a chunk read). Answers go only to reply subjects inside
// Config.ReplyPrefixes; a request naming any other gets no answer, and is
// counted and logged (service.go). An instance answers with 4 workers,
// one request of a session at a time, round-robin over the sessions with
// requests waiting; at most 8 of a session and 512 in all wait, and more
// are answered 503 at once, as is a request that waited past 5 seconds.
// Deployments give the responder identity subscribe on <prefix>.recover.>
// and $SRV.> and publish on the inbox prefixes alone (no allow_responses,
// on it or on the processor's identity); agents publish on
// <prefix>.recover.> (or on their own sessions' subjects), operators on
// $SRV.> (deploy/nats/permissions.conf).
//
// Rebuild derives every session's state from the events stream alone and
// compares it with the bucket (see its doc for how spill outcomes are found,
// and Hand-overs for the leases it takes).
//
// Run drains on cancellation: it stops fetching and finishes what it fetched.
// Abort stops at once, as a crash would.
//
// An Observer (WithObserver; package metrics implements one) is told of every
// input stepped, every output once its publish is acknowledged, every spill,
// state write and compare-and-swap conflict; each acknowledged verdict is also
// logged with its session, sequence and kind.
package processor
