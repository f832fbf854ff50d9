/**
 * The wire contract's values, as the client takes and returns them
 * (docs/contract.md; events/types.go on the Go side). Field
 * names are camelCase here; on the wire they are snake_case.
 *
 * @module
 */

/** What a session's offsets count. */
export type Unit = "turns" | "tokens" | "messages";

/** The units a session may declare. */
export const UNITS: readonly Unit[] = ["turns", "tokens", "messages"];

/**
 * The largest offset, size or range bound seamguard accepts: 2^53, the
 * largest integer every JSON implementation (and a JavaScript number)
 * represents exactly.
 */
export const MAX_OFFSET = 2 ** 53;

/** A half-open offset interval `[start, end)`, empty when `start === end`. */
export interface Range {
  readonly start: number;
  readonly end: number;
}

/**
 * Writes a range as the half-open interval it is, `[0, 5)`, as verdict
 * messages and the Go client's `events.Range.String` do.
 */
export function formatRange(r: Range): string {
  return `[${r.start}, ${r.end})`;
}

/** The prefix of every seamguard event type. */
export const TYPE_PREFIX = "io.seamguard.";

/** CloudEvents types of the events an agent publishes. */
export const InputTypes = {
  sessionOpened: "io.seamguard.session.opened",
  turnAppended: "io.seamguard.turn.appended",
  contextTruncated: "io.seamguard.context.truncated",
  contextPinned: "io.seamguard.context.pinned",
  contextUnpinned: "io.seamguard.context.unpinned",
  compactionRequested: "io.seamguard.compaction.requested",
  compactionCommitted: "io.seamguard.compaction.committed",
  sessionClosed: "io.seamguard.session.closed",
} as const;

/** The CloudEvents type of an event an agent publishes. */
export type InputType = (typeof InputTypes)[keyof typeof InputTypes];

/** CloudEvents types of the verdicts seamguard publishes. */
export const VerdictTypes = {
  compactionAllowed: "io.seamguard.compaction.allowed",
  compactionRefused: "io.seamguard.compaction.refused",
  transcriptSpilled: "io.seamguard.transcript.spilled",
  sessionHalted: "io.seamguard.session.halted",
  eventRejected: "io.seamguard.event.rejected",
  compactionViolation: "io.seamguard.compaction.violation",
} as const;

/**
 * Why a compaction was refused: a failed check (docs/contract.md, The
 * decision) or a rule-1 refusal. Codes a newer processor adds arrive as strings.
 */
export type ReasonCode =
  | "unit_mismatch"
  | "floor_not_in_tail"
  | "floor_not_in_input"
  | "reach_not_in_input"
  | "seam_gap"
  | "coverage_hole"
  | "sequence_gap"
  | "pin_dropped"
  | "invalid_request"
  | "unknown_session"
  | "session_closed"
  | "session_halted"
  | (string & NonNullable<unknown>);

/**
 * Why an event was rejected (docs/contract.md, Outputs). Codes a newer
 * processor adds arrive as strings.
 */
export type RejectionCode =
  | "malformed"
  | "missing_attribute"
  | "bad_specversion"
  | "bad_session_id"
  | "subject_mismatch"
  | "unknown_type"
  | "bad_data"
  | "unknown_session"
  | "already_open"
  | "session_closed"
  | "offset_conflict"
  | "range_out_of_bounds"
  | "too_large"
  | "state_limit"
  | "not_permitted"
  | (string & NonNullable<unknown>);

/** What an agent should do after a refusal. */
export type Next = "retry" | "none" | "carry_pins" | (string & NonNullable<unknown>);

/**
 * A compaction an agent asks seamguard about (the data of
 * `io.seamguard.compaction.requested`).
 */
export interface CompactionRequest {
  /**
   * Names the compaction; a commit names it again. Empty or absent: the
   * client makes a fresh one. A retry keeps it.
   */
  readonly requestId?: string;
  /** The offsets the summarizer reads (clipped to `[0, head)`). */
  readonly summarizerInput: Range;
  /** The offsets the summary claims to cover. */
  readonly summaryRange: Range;
  /** Where the verbatim tail starts; the tail is `[tailStart, head)`. */
  readonly tailStart: number;
  /** Whether the new summary carries the committed one. */
  readonly carriesPriorSummary?: boolean;
  /** Context occupancy in tokens; informational. */
  readonly occupancy?: number;
  /** Compaction threshold in tokens; informational. */
  readonly threshold?: number;
  /**
   * Pinned turns the agent puts back into the new context verbatim,
   * outside the summary.
   */
  readonly carriedPins?: readonly Range[];
}

/** A compaction request as it was sent: its request id is filled in. */
export type SentCompactionRequest = CompactionRequest & { readonly requestId: string };

/**
 * Names a lossless transcript seamguard wrote into the object store, and
 * proves it (a spill handle). `size`, `digest`, `events`, `firstSeq` and
 * `lastSeq` describe this object alone; `range` is what the chain of spills
 * ending here makes recoverable; `previous` names the spill before it.
 */
export interface SpillHandle {
  readonly bucket: string;
  readonly name: string;
  /** `SHA-256=` and the URL-safe base64 of the object's SHA-256, padded. */
  readonly digest: string;
  readonly size: number;
  readonly range: Range;
  readonly events: number;
  readonly firstSeq: number;
  readonly lastSeq: number;
  readonly previous: string | null;
}

/** Counts every range of a list a verdict cut short. */
export interface RangeTotal {
  readonly ranges: number;
  readonly units: number;
}

/** One failed check of a refused compaction, with the offsets it puts at risk. */
export interface Reason {
  readonly code: ReasonCode;
  readonly message: string;
  readonly atRisk: readonly Range[];
  /** True when `atRisk` lists only the first 1,000 ranges. */
  readonly atRiskTruncated: boolean;
  /** With `atRiskTruncated`: how many ranges and units there are in all. */
  readonly atRiskTotal?: RangeTotal;
}

/** The data of `io.seamguard.compaction.allowed`. */
export interface CompactionAllowed {
  readonly requestId: string;
  readonly head: number;
  readonly summaryCoverage: readonly Range[];
  readonly summaryCoverageTruncated: boolean;
  readonly tailStart: number;
  /** The spills that hold the offsets this compaction drops (may be empty). */
  readonly recoveredBy: readonly SpillHandle[];
  /** The checks that failed and are cured by spills or waivers. */
  readonly cured: readonly ReasonCode[];
}

/** The data of `io.seamguard.compaction.refused`. */
export interface CompactionRefused {
  readonly requestId: string;
  readonly reasons: readonly Reason[];
  /** The spill written for this refusal, or null. */
  readonly spill: SpillHandle | null;
  readonly next: Next;
  /**
   * On a refusal that `pin_dropped` alone causes: the other failed checks,
   * which spills or waivers already cover (`reasons` then lists
   * `pin_dropped` alone). Empty on every other refusal.
   */
  readonly cured: readonly ReasonCode[];
}

/** The data of `io.seamguard.session.halted`. */
export interface SessionHalted {
  /** The request the halt answers; empty for a halt on a state limit. */
  readonly requestId: string;
  readonly unrecoverable: readonly Range[];
  readonly unrecoverableTruncated: boolean;
  readonly message: string;
}

/** Where a rejected input came from (the `input` of an `event.rejected`). */
export interface RejectedInput {
  /** The subject the input was published on. */
  readonly subject: string;
  /** Its sequence in the events stream. */
  readonly streamSeq: number;
  /** Its headers, as seamguard echoes them (bounded). */
  readonly headers: Readonly<Record<string, readonly string[]>>;
}

/** The data of `io.seamguard.event.rejected`. */
export interface EventRejected {
  readonly code: RejectionCode;
  /** The attribute or data field at fault (`data.request_id`, `source`, ...), or empty. */
  readonly field: string;
  readonly message: string;
  readonly input: RejectedInput;
}

/**
 * A JSON object as it arrived, for fields the typed views leave out.
 * Values are JSON values.
 */
export type JsonObject = Readonly<Record<string, unknown>>;
