// Package inspect shows an operator what seamguard knows of a session, and
// checks that what it decided can be decided again.
//
// A Model is one session's ledger (from the session bucket's snapshot, or
// rebuilt from the events stream with the pure core) together with its
// decision history (the session's verdicts, in verdict stream order). Build
// derives the picture's three tracks over [0, head) from the ledger's sets:
//
//   - the context track says what the agent's working context holds: the
//     committed summary's coverage K, the verbatim tail (received, neither
//     truncated nor summarised), truncated offsets in no summary (T \ K),
//     and gaps (never received);
//   - the backup track says what else holds an offset: a verified spill
//     (P), an operator's waiver (W), or nothing at all: a hole, an offset
//     that is in neither the summary nor the verbatim context nor any
//     spill or waiver;
//   - the pinned track shows the pinned offsets (N): turns the agent said
//     must stay in its working context, which no compaction may drop
//     unless it carries them back (carried_pins).
//
// Each entry of the history also says which pinned offsets a refusal
// drops (its pin_dropped reason) and which ranges the request it answers
// carried (read from the events stream, while the request is there).
//
// WriteText draws the model for a terminal (plain characters, or ANSI
// colours), WriteSVG as a standalone SVG timeline, and the Model itself is
// the JSON form.
//
// Deriver steps input messages through ledger.Step exactly as the
// processor's runtime does, with spill outcomes taken from the verdict
// stream (Outcomes), because whether a spill succeeded is a fact of the
// past and not of the events. Source.Replay uses it to derive every
// decision again and compare it, verdict by verdict, with a verdict stream;
// Source.Rebuild uses it to build one session's ledger without the bucket.
//
// Every message read from the verdict stream is verified first
// (Source.Verifier, package attest). One that fails (unsigned, signed by a
// key not trusted, changed after signing, a verdict of another session or
// kind) counts for nothing: it is left out of the history and of the spill
// outcomes, listed in Model.Unattributed, and is a Difference of kind
// "unattributed" in a replay, never compared with a derived verdict.
//
// Nothing here writes to NATS, and a Source creates no consumer: it reads
// the streams with get requests (package jsread), so the operator identity
// it runs as needs no consumer API.
package inspect
