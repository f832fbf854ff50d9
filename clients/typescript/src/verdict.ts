/**
 * Verdicts: seamguard's answers to compaction requests, typed as a
 * discriminated union on `type` (and on `kind`), and the parsing of the
 * verdict events that carry them.
 *
 * @module
 */

import type { Unattributed } from "./config.js";
import { VerdictTypes } from "./types.js";
import type {
  CompactionAllowed,
  CompactionRefused,
  EventRejected,
  JsonObject,
  Range,
  RangeTotal,
  Reason,
  SentCompactionRequest,
  SessionHalted,
  SpillHandle,
} from "./types.js";

/** What every verdict carries besides its data. */
export interface VerdictBase {
  /** The verdict event's id (derived from the request event it answers). */
  readonly id: string;
  /** The processor instance that decided it. */
  readonly source: string;
  /** The session (the verdict event's CloudEvents subject). */
  readonly session: string;
  /** When the processor decided it (RFC 3339), if it said. */
  readonly time?: string;
  /** The id of the event it answers: {@link VerdictBase.eventId}. */
  readonly causationId: string;
  /** The id of the `compaction.requested` event that was published. */
  readonly eventId: string;
  /** The request this verdict answers, with its request id filled in. */
  readonly request: SentCompactionRequest;
  /**
   * For a verdict {@link Session.compact} returns after a retry or after
   * carrying pins: the refusal before it (with its spill handle, if one was
   * written; its own `previous` the one before). Absent otherwise.
   */
  readonly previous?: Verdict;
  /** The verdict event as it arrived (structured CloudEvent JSON). */
  readonly event: JsonObject;
  /** The public NKey whose signature the verdict carries. */
  readonly signer: string;
  /**
   * Whether the signer is one of the client's `trustedKeys` (false when
   * none are configured: the signature was checked, not who made it).
   */
  readonly trusted: boolean;
  /**
   * Messages that claimed to answer this request while the client waited
   * and failed verification: they were not taken for the answer.
   */
  readonly unattributed: readonly Unattributed[];
}

/** The compaction is allowed: apply it, then {@link Session.commit} it. */
export interface AllowedVerdict extends VerdictBase {
  readonly type: typeof VerdictTypes.compactionAllowed;
  readonly kind: "allowed";
  readonly data: CompactionAllowed;
}

/**
 * The compaction is refused. `data.next` says what to do: `retry`
 * (seamguard spilled the transcript; the same request will be allowed),
 * `carry_pins` (carry the dropped pinned turns), or `none`.
 */
export interface RefusedVerdict extends VerdictBase {
  readonly type: typeof VerdictTypes.compactionRefused;
  readonly kind: "refused";
  readonly data: CompactionRefused;
}

/**
 * The session is halted: nothing can be recovered of what the compaction
 * would drop. Every compaction is refused until an operator resumes the
 * session.
 */
export interface HaltedVerdict extends VerdictBase {
  readonly type: typeof VerdictTypes.sessionHalted;
  readonly kind: "halted";
  readonly data: SessionHalted;
}

/** seamguard's answer to one compaction request. */
export type Verdict = AllowedVerdict | RefusedVerdict | HaltedVerdict;

/**
 * Reports whether `v` is a refusal whose next step is `retry`: seamguard
 * wrote a spill that covers what the compaction puts at risk, and the same
 * compaction requested again will be allowed (unless the session changed).
 */
export function isRetryable(v: Verdict | undefined): v is RefusedVerdict {
  return v !== undefined && v.kind === "refused" && v.data.next === "retry";
}

/**
 * Reports whether `v` is a refusal whose next step is `carry_pins`: the
 * compaction would drop pinned turns from the working context.
 */
export function mustCarryPins(v: Verdict | undefined): v is RefusedVerdict {
  return v !== undefined && v.kind === "refused" && v.data.next === "carry_pins";
}

/**
 * The pinned offsets a refusal says the compaction would drop (the at-risk
 * ranges of its `pin_dropped` reason), and whether that list is complete.
 */
export function droppedPins(v: Verdict): { pins: readonly Range[]; complete: boolean } {
  if (v.kind !== "refused") return { pins: [], complete: true };
  const r = v.data.reasons.find((reason) => reason.code === "pin_dropped");
  return r === undefined ? { pins: [], complete: true } : { pins: r.atRisk, complete: !r.atRiskTruncated };
}

// ---- parsing (internal) ----

/** A verdict event as it arrived: its envelope and its data. @internal */
export interface VerdictEvent {
  readonly id: string;
  readonly source: string;
  readonly type: string;
  readonly subject: string;
  readonly time?: string;
  readonly causationId: string;
  readonly data: JsonObject;
  readonly raw: JsonObject;
}

class Malformed extends Error {}

function obj(v: unknown, what: string): JsonObject {
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Malformed(`${what} is not an object`);
  return v as JsonObject;
}

function str(o: JsonObject, key: string, optional = false): string {
  const v = o[key];
  if (v === undefined && optional) return "";
  if (typeof v !== "string") throw new Malformed(`${key} is not a string`);
  return v;
}

function num(o: JsonObject, key: string, optional = false): number {
  const v = o[key];
  if (v === undefined && optional) return 0;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0) throw new Malformed(`${key} is not a non-negative integer`);
  return v;
}

function bool(o: JsonObject, key: string): boolean {
  return o[key] === true;
}

function list<T>(o: JsonObject, key: string, item: (v: unknown) => T): T[] {
  const v = o[key];
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw new Malformed(`${key} is not a list`);
  return v.map(item);
}

function range(v: unknown): Range {
  const o = obj(v, "range");
  return { start: num(o, "start"), end: num(o, "end") };
}

function total(v: unknown): RangeTotal | undefined {
  if (v === undefined || v === null) return undefined;
  const o = obj(v, "total");
  return { ranges: num(o, "ranges"), units: num(o, "units") };
}

/** Parses a spill handle from its wire JSON. @internal */
export function parseSpillHandle(v: unknown): SpillHandle {
  const o = obj(v, "spill handle");
  const prev = o["previous"];
  if (prev !== undefined && prev !== null && typeof prev !== "string") throw new Malformed("previous is not a string");
  return {
    bucket: str(o, "bucket"),
    name: str(o, "name"),
    digest: str(o, "digest"),
    size: num(o, "size"),
    range: range(o["range"]),
    events: num(o, "events"),
    firstSeq: num(o, "first_seq"),
    lastSeq: num(o, "last_seq"),
    previous: typeof prev === "string" ? prev : null,
  };
}

function reason(v: unknown): Reason {
  const o = obj(v, "reason");
  const t = total(o["at_risk_total"]);
  return {
    code: str(o, "code"),
    message: str(o, "message", true),
    atRisk: list(o, "at_risk", range),
    atRiskTruncated: bool(o, "at_risk_truncated"),
    ...(t === undefined ? {} : { atRiskTotal: t }),
  };
}

function stringItem(v: unknown): string {
  if (typeof v !== "string") throw new Malformed("not a string");
  return v;
}

/** @internal */
export function parseAllowed(d: JsonObject): CompactionAllowed {
  return {
    requestId: str(d, "request_id"),
    head: num(d, "head"),
    summaryCoverage: list(d, "summary_coverage", range),
    summaryCoverageTruncated: bool(d, "summary_coverage_truncated"),
    tailStart: num(d, "tail_start"),
    recoveredBy: list(d, "recovered_by", parseSpillHandle),
    cured: list(d, "cured", stringItem),
  };
}

/** @internal */
export function parseRefused(d: JsonObject): CompactionRefused {
  const spill = d["spill"];
  return {
    requestId: str(d, "request_id"),
    reasons: list(d, "reasons", reason),
    spill: spill === undefined || spill === null ? null : parseSpillHandle(spill),
    next: str(d, "next"),
    cured: list(d, "cured", stringItem),
  };
}

/** @internal */
export function parseHalted(d: JsonObject): SessionHalted {
  return {
    requestId: str(d, "request_id", true),
    unrecoverable: list(d, "unrecoverable", range),
    unrecoverableTruncated: bool(d, "unrecoverable_truncated"),
    message: str(d, "message", true),
  };
}

/** @internal */
export function parseRejected(d: JsonObject): EventRejected {
  const input = d["input"] === undefined || d["input"] === null ? {} : obj(d["input"], "input");
  const hdrs: Record<string, readonly string[]> = {};
  const raw = input["headers"];
  if (raw !== undefined && raw !== null) {
    for (const [k, vals] of Object.entries(obj(raw, "headers"))) {
      hdrs[k] = Array.isArray(vals) ? vals.filter((x): x is string => typeof x === "string") : [];
    }
  }
  return {
    code: str(d, "code"),
    field: str(d, "field", true),
    message: str(d, "message", true),
    input: { subject: str(input, "subject", true), streamSeq: num(input, "stream_seq", true), headers: hdrs },
  };
}

const decoder = new TextDecoder();

/**
 * Parses a verdict event (structured CloudEvent JSON); undefined when it is
 * not one. @internal
 */
export function parseVerdictEvent(body: Uint8Array): VerdictEvent | undefined {
  try {
    const raw = obj(JSON.parse(decoder.decode(body)) as unknown, "event");
    const time = raw["time"];
    return {
      id: str(raw, "id"),
      source: str(raw, "source", true),
      type: str(raw, "type"),
      subject: str(raw, "subject", true),
      ...(typeof time === "string" ? { time } : {}),
      causationId: str(raw, "causationid", true),
      data: obj(raw["data"], "data"),
      raw,
    };
  } catch {
    return undefined;
  }
}

/**
 * Makes the verdict `ev` carries for `request` (published as `eventId`),
 * or undefined when `ev` is not an allowed, refused or halted verdict of
 * that request, or is malformed. @internal
 */
export function toVerdict(
  ev: VerdictEvent,
  request: SentCompactionRequest,
  eventId: string,
  attribution: { signer: string; trusted: boolean; unattributed: readonly Unattributed[] } = { signer: "", trusted: false, unattributed: [] },
): Verdict | undefined {
  if (ev.causationId !== eventId) return undefined;
  const base = {
    ...attribution,
    id: ev.id,
    source: ev.source,
    session: ev.subject,
    ...(ev.time === undefined ? {} : { time: ev.time }),
    causationId: ev.causationId,
    eventId,
    request,
    event: ev.raw,
  };
  try {
    switch (ev.type) {
      case VerdictTypes.compactionAllowed: {
        const data = parseAllowed(ev.data);
        return data.requestId === request.requestId ? { ...base, type: ev.type, kind: "allowed", data } : undefined;
      }
      case VerdictTypes.compactionRefused: {
        const data = parseRefused(ev.data);
        return data.requestId === request.requestId ? { ...base, type: ev.type, kind: "refused", data } : undefined;
      }
      case VerdictTypes.sessionHalted: {
        const data = parseHalted(ev.data);
        return data.requestId === request.requestId ? { ...base, type: ev.type, kind: "halted", data } : undefined;
      }
      default:
        return undefined; // transcript.spilled: the refusal that follows carries the handle
    }
  } catch {
    return undefined;
  }
}

/**
 * Reports which of our events the rejection `ev` (data `d`) answers, if
 * any: its id. A rejection has a causationid when the event decoded far
 * enough to have an id; otherwise it names the input by its headers: the
 * client set `Nats-Msg-Id` to `msgId(source, id)` (`byMsgId` maps it back
 * to our event id) and, in binary mode, `ce-id` to the event id.
 * @internal
 */
export function rejects(
  ev: VerdictEvent,
  d: EventRejected,
  isOurs: (id: string) => boolean,
  byMsgId: (msgId: string) => string | undefined,
): string | undefined {
  if (ev.causationId !== "") return isOurs(ev.causationId) ? ev.causationId : undefined;
  for (const [name, vals] of Object.entries(d.input.headers)) {
    const n = name.toLowerCase();
    for (const v of vals) {
      if (n === "ce-id" && isOurs(v)) return v;
      if (n === "nats-msg-id") {
        const id = byMsgId(v);
        if (id !== undefined) return id;
      }
    }
  }
  return undefined;
}
