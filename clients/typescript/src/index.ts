/**
 * `@seamguard/client`: the TypeScript client agents use to talk to
 * seamguard. It publishes a session's events as CloudEvents to the events
 * stream, waits for the verdicts on compaction requests, follows the
 * refuse, spill, retry and carry-pins flows, and recovers spilled
 * transcripts through the processor's recover service.
 *
 * ```ts
 * import { connect } from "@nats-io/transport-node";
 * import { SeamguardClient } from "@seamguard/client";
 *
 * const nc = await connect({ servers: "nats://127.0.0.1:4222" });
 * const client = new SeamguardClient(nc, { source: "urn:agent:billing/worker-3" });
 * const s = await client.open({ id: "ops-agent-42", span: 12 }); // floor: the last 12 turns survive
 * await s.append({ role: "user", content: "Rotate the TLS certificate..." });
 * await s.truncated({ start: 0, end: 8 }, "budget"); // budget enforcement evicted the 8 oldest turns
 * const v = await s.compact({ requestId: "compact-1", summarizerInput: { start: 8, end: 52 }, summaryRange: { start: 8, end: 40 }, tailStart: 40 });
 * if (v.kind === "allowed") {
 *   // apply it; v.previous, if set, is the refusal whose spill holds what the summary drops
 *   await s.commit(v.request.requestId);
 * }
 * await s.close();
 * ```
 *
 * @packageDocumentation
 */

export { SeamguardClient } from "./client.js";
export { Session, validateSessionOptions } from "./session.js";
export type { CallOptions, SessionOptions, Turn, VerdictOptions } from "./session.js";
export { Defaults, resolveConfig, streamName, subjects, validSessionId, validateConfig } from "./config.js";
export type { ClientConfig, ResolvedConfig, Subjects, Unattributed } from "./config.js";
export { SignatureHeaders, decodePublicNKey, parseTrustedKeys, verifyVerdict } from "./attest.js";
export type { Attribution, SignedMessage, UnattributedReason, VerifyOptions } from "./attest.js";
export {
  ArgumentError,
  BrokenChainError,
  DigestMismatchError,
  NoVerdictError,
  NotPublishedError,
  NotRecoveredError,
  NotRetryableError,
  RecoverServiceError,
  RejectedError,
  SeamguardError,
  SessionClosedError,
  SpillForbiddenError,
  SpillNotFoundError,
} from "./errors.js";
export type { ErrorCode } from "./errors.js";
export { droppedPins, isRetryable, mustCarryPins } from "./verdict.js";
export type { AllowedVerdict, HaltedVerdict, RefusedVerdict, Verdict, VerdictBase } from "./verdict.js";
export { decodeDigest, sameDigest } from "./recover.js";
export type { ChunkSink, RecoverOptions, RecoveredTranscript } from "./recover.js";
export { MSG_ID_PREFIX, msgId, percentEncode } from "./encode.js";
export { InputTypes, MAX_OFFSET, TYPE_PREFIX, UNITS, VerdictTypes, formatRange } from "./types.js";
export type {
  CompactionAllowed,
  CompactionRefused,
  CompactionRequest,
  EventRejected,
  InputType,
  JsonObject,
  Next,
  Range,
  RangeTotal,
  Reason,
  ReasonCode,
  RejectedInput,
  RejectionCode,
  SentCompactionRequest,
  SessionHalted,
  SpillHandle,
  Unit,
} from "./types.js";
