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
// ones (T), the committed summary coverage (K), the spilled ones (P) and the
// waived ones (W), as RangeSets. A compaction request is checked as
// CONTRACT.md section 5 says (see Evaluate) and decided by its rules 1 to 5.
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
//     was; a session closed while halted keeps its halt ranges;
//   - recovered_by names the newest spill: every spill holds every received
//     offset of [0, head) at its time, so the newest holds all that any holds.
//
// seamguard refuses every compaction the seed's reference check refuses,
// except where that check's floor start (tail_start - span) is negative or
// the span is 0: there it refuses compactions that lose nothing (the offsets
// it names do not exist or sit in the verbatim tail), and the contract's
// clamped reach allows them. seedcheck_test.go shows both halves.
//
// A Ledger is not safe for concurrent use: one goroutine owns it.
package ledger
