// Package ledger is seamguard's pure decision core: the per-session coverage
// ledger and Step, which applies one input to it and says what must happen.
//
// Step is shaped like etcd raft's: state and input in, new state and outputs
// out, no I/O, no clock, no randomness. Replaying the same inputs always gives
// the same ledger and the same outputs, which is what makes verdicts
// effectively-once on an at-least-once stream and lets an operator re-derive
// every decision from the events stream.
//
// The ledger tracks, in the session's unit, the received offsets, the truncated
// ones (T), the committed summary coverage (K), the spilled ones (P), the
// waived ones (W) and the pinned ones (N), as RangeSets. A compaction request
// is checked as docs/contract.md says (see Evaluate) and decided
// by rules 1 to 5.
//
// # Pinned turns
//
// A turn appended with pinned true, and the received offsets of a
// context.pinned range, join N; context.unpinned takes every offset of its
// range out of N. Both ranges must lie within [0, head) (else
// range_out_of_bounds); a reversed one is bad_data. Offsets never received
// are not pinned, and a turn that later fills such a gap is pinned only if
// it says so. A compaction request may carry pinned turns back into the new
// context verbatim, outside the summary: carried_pins, a list of ranges,
// any of them reversed or the list malformed making the request
// invalid_request (rule 1). Ranges past head are accepted and carry nothing
// more.
//
// The check pin_dropped fails when N ⊄ R ∪ carried, R being the tail
// without its truncated offsets, and names N \ (R ∪ carried). It sorts
// among the other codes ("floor_not_in_tail" < "pin_dropped" <
// "reach_not_in_input"). Spills and waivers never cure it: rules 3 to 5
// look at the other failed checks alone (Evaluation.AtRisk leaves
// pin_dropped out; Evaluation.Dropped holds it). Then:
//   - when rule 2 or 3 would allow the request, it is refused instead, with
//     no spill and next carry_pins; its reasons list pin_dropped alone,
//     the one thing the agent must fix, and cured names the other failed
//     checks, which spills or waivers cover, as an allowed verdict does;
//   - when rule 4 spills, the refusal lists pin_dropped with the rest and
//     says next carry_pins rather than retry: a plain retry would be
//     refused again;
//   - rule 5 halts as it would without pins, naming only what no spill
//     holds (pinned offsets are received, so they are never unrecoverable).
//
// The request is recorded as refused, so committing it is a violation.
// pin_dropped's message names the pinned offsets and spells out the
// carried_pins value that keeps them. The check does not judge what the
// summary says: a carried pin is trusted to be the pinned turn verbatim.
// N counts against MaxRanges (state_limit with field ledger.pinned) and
// the snapshot size like every other set. Like a truncation, a pin or an
// unpin that arrives again long after the duplicate windows is applied
// again; JetStream's dedupe window stops ordinary redeliveries.
// The core does not write spills: when rule 4 applies, Step returns a
// SpillRequest and the caller must Step the SpillResult next; only then are the
// verdicts (transcript.spilled and compaction.refused, or session.halted) known.
//
// Choices where the contract is silent:
//   - compaction.requested for an unknown or closed session is refused
//     (unknown_session, session_closed), every other type is rejected with
//     the rejection code of the same name;
//   - a second session.opened with the same unit and floor is accepted and
//     changes nothing (window and trigger are informational and not compared);
//   - session.resumed on a session that is not halted is accepted and changes
//     nothing; a second session.closed is rejected as session_closed;
//   - duplicates: an event whose (source, id) is among the last 8 accepted
//     ones produces no output and changes nothing. Events whose replay
//     would change state are remembered longer: compaction requests and
//     commits by the last 16 ids of their request_id, session.resumed by
//     the last 64 ids, so a stale copy never re-decides a request, puts back
//     an older summary coverage, or lifts a later halt. Other duplicates are
//     idempotent (opens, truncations) or stopped by JetStream's dedupe
//     window; a very late duplicate turn is rejected as offset_conflict, so
//     it is never applied twice;
//   - a ledger belongs to the session of its first accepted event; a
//     rejected event, even the first, leaves the ledger byte-for-byte as it
//     was, but for the halt that a rejection at a state limit brings (see
//     Limits); a session closed while halted keeps its halt ranges;
//   - recovered_by names the newest spill: with the chain of spills before
//     it, it holds every received offset of [0, head) at its time, so it
//     holds all that any spill holds.
//
// # Incremental spills
//
// Rule 4 asks (SpillRequest) only for what no earlier spill of the session
// holds: the accepted events from the previous spill's last_seq + 1 (the
// session's first event for the first spill) to the request, Events of
// them, with Previous naming the spill before (empty for the first) and
// Range = [0, head), what the chain makes recoverable. The ledger records
// the handle with previous set from its own chain (null for the first),
// whatever the writer filled in, and the transcript.spilled and
// compaction.refused outputs carry it. A spill whose handle is larger than
// MaxBytes, or whose result says OverQuota, is not recorded.
//
// # Limits
//
// Config.Limits bounds what one session's ledger holds; the zero value of
// each field is its default, and Validate reports every problem at once:
//   - MaxRanges (default 100,000): ranges in any one set: received,
//     truncated, committed and every request's summary coverage, waived,
//     pinned, and a halt's unrecoverable ranges. spilled needs no check of its own:
//     it is always part of received.
//   - MaxRequests (default and least 256): request ids remembered. Past
//     it, the least recently used one is forgotten (used: requested, or
//     committed; every use is stamped with a counter kept in the snapshot,
//     so forgetting is deterministic and survives a restart).
//   - MaxSnapshotBytes (default 512 KiB, half NATS's default max payload,
//     at least 4 KiB): the snapshot; the runtime passes the smaller of its
//     configuration and the bucket's value limit. 64 bytes of it are kept
//     free for the halt a state limit adds, so a halted session's snapshot
//     stays within the limit.
//   - SpillQuota (default 1 GiB): the bytes of all the spills of a session,
//     the sum of their handles' sizes.
//
// An event that would take a set past MaxRanges, or the snapshot past its
// limit (and make it larger), is rejected with state_limit, its field
// naming what it would exceed (ledger.received, ledger.truncated,
// ledger.pinned,
// ledger.coverage for a request's summary coverage, ledger.committed,
// ledger.waived for a resume, ledger.halt for a rule-5 halt with too many
// ranges, ledger.snapshot) and its message the limit and its value. In the
// same Step the session is halted: session.halted with an empty request_id
// and as unrecoverable the offsets the event concerned: a turn's range (it
// may lie beyond head: those offsets were never recorded; resuming waives
// them), a truncation's, pin's or unpin's range, or [0, head) for any
// other event. A halt
// already in force gains those offsets; it names their hull instead when
// the snapshot has no room for one range more. Any halt whose ranges would
// exceed MaxRanges names the whole transcript [0, end) instead, and says
// so. A rejected event changes nothing but the halt. On a session never
// opened there is nothing to halt: the rejection comes alone. A halt at a
// limit is lifted like any other, by session.resumed; one whose waiver
// would take waived past MaxRanges cannot be (start a new session).
//
// The snapshot size is not computed on every Step: the ledger keeps the
// size it last measured plus a bound on what each Step since may have
// added, computed from the ledger and the event before it is applied.
// While that estimate is within the limit the Step runs as usual; near the
// limit it runs on a copy whose snapshot is measured, which replaces the
// ledger when it fits. A session pays for encoding only near its limit.
//
// A request that needs a spill when the session has spilled SpillQuota
// bytes already is rule 5: halted, the message naming the quota. So is a
// spill result over what was left of it. A spill result that the snapshot
// has no room to record halts the session too, naming [0, head).
//
// Forgotten request ids: the ledger keeps the hashes (64-bit FNV-1a) of the
// last 1,024 request ids it forgot that rules 2 to 5 had decided, and a
// count of all it ever forgot. A commit naming one of them is a violation
// saying seamguard no longer remembers the request. A commit naming an id
// it does not know, once more ids were forgotten than it keeps hashes of,
// is a violation saying it either never decided the request or forgot it;
// otherwise it is the violation for a compaction never decided, which
// changes nothing. The first two leave no summary coverage committed (K is
// emptied): the agent's context changed in a way seamguard cannot know, so
// it credits no prior summary from then on (fail closed). A forgotten
// request that comes again is evaluated again.
//
// # Bounded outputs
//
// No input makes an output over events.MaxOutputBytes (64 KiB): every
// message and output field that echoes input quotes at most 256 bytes of
// it (events.Excerpt), messages spell out at most 8 ranges, event.rejected
// echoes the input's headers through events.EchoHeaders, and long range
// lists are cut: the reasons of one refusal list at most 1,000 at-risk
// ranges together (a reason with few ranges lists them all, the others
// share the rest evenly), session.halted lists at most 1,000 unrecoverable
// ranges, compaction.allowed at most 1,000 summary_coverage ranges. A list
// cut short is followed by its *_truncated flag and *_total count (ranges
// and units); the ledger keeps the full sets, and inspect and replay
// derive them.
//
// seamguard refuses every compaction the classic check (internal/seedref) refuses,
// except where that check's floor start (tail_start - span) is negative or
// the span is 0: there it refuses compactions that lose nothing (the offsets
// it names do not exist or sit in the verbatim tail), and the contract's
// clamped reach allows them. seedcheck_test.go shows both halves.
//
// A Ledger is not safe for concurrent use: one goroutine owns it.
package ledger
