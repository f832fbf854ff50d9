/**
 * The client's configuration and the subject names it derives from it.
 *
 * @module
 */

import { parseTrustedKeys, type UnattributedReason } from "./attest.js";
import { ArgumentError } from "./errors.js";

/**
 * A message on a session's verdict subjects that failed verification: not
 * a verdict a trusted processor published as it is (see `attest.ts`).
 */
export interface Unattributed {
  /** The NATS subject it arrived on. */
  readonly subject: string;
  /** Why it failed. */
  readonly reason: UnattributedReason;
  /** What was found, in words. */
  readonly message: string;
  /** The key it names, if it names one. */
  readonly signer?: string;
  /** Its body as JSON, when it parses: what it claims to be. */
  readonly claims?: Readonly<Record<string, unknown>>;
}

/** Defaults of {@link ClientConfig}; an absent field means its default. */
export const Defaults = {
  prefix: "seamguard",
  source: "urn:seamguard:client",
  ackTimeoutMs: 5_000,
  publishAttempts: 5,
  verdictTimeoutMs: 30_000,
} as const;

/**
 * Configures a {@link SeamguardClient}. Every field is optional: `{}`
 * talks to a seamguard deployment with the default prefix `seamguard`:
 * events go to `seamguard.events.<session>` and must land in the stream
 * `SEAMGUARD_EVENTS`, in binary content mode, with source
 * `urn:seamguard:client`.
 */
export interface ClientConfig {
  /**
   * The first token(s) of every subject, as the processor's `--prefix`;
   * default `seamguard`.
   */
  readonly prefix?: string;
  /**
   * The events stream every publish must land in (checked by JetStream
   * through the `Nats-Expected-Stream` header, so a stray stream capturing
   * the subject is an error, not a silent loss); default: the name the
   * processor derives from the prefix, `SEAMGUARD_EVENTS` for the default.
   */
  readonly stream?: string;
  /**
   * The CloudEvents source of every event, naming the agent (for example
   * `urn:agent:billing/worker-3`); default `urn:seamguard:client`.
   */
  readonly source?: string;
  /**
   * Publish events in structured content mode (the whole event as JSON,
   * `Content-Type: application/cloudevents+json`) instead of binary mode
   * (`ce-*` headers, the data as the body).
   */
  readonly structured?: boolean;
  /**
   * How long one publish attempt waits for its JetStream ack, and one
   * request to the recover service for its answer, in milliseconds;
   * default 5000.
   */
  readonly ackTimeoutMs?: number;
  /**
   * How many times one event is published before a call gives up (a lost
   * ack, no stream responding, a reconnect); default 5. Every attempt
   * carries the same `Nats-Msg-Id`.
   */
  readonly publishAttempts?: number;
  /**
   * How long a compaction request waits for its verdict when the call
   * gives no `timeoutMs`, in milliseconds; default 30000. A call's
   * `signal` may end the wait sooner.
   */
  readonly verdictTimeoutMs?: number;
  /**
   * The public NKeys (`N…`) of the processors whose verdicts the client
   * believes: what `seamguard serve` logs as `signing_key`. Give several
   * during a key rotation; an element may hold several, separated by
   * commas or white space. Empty (the default): a verdict's signature is
   * checked against the key it names, whoever that is, and the verdict's
   * `trusted` is false; set it in production. Either way a verdict that
   * fails verification is never taken for an answer.
   */
  readonly trustedKeys?: readonly string[];
  /**
   * Called for every message on a session's verdict subjects that fails
   * verification (unsigned, signed by a key not trusted, changed after
   * signing, or a verdict of another session or kind).
   */
  readonly onUnattributed?: (u: Unattributed) => void;
}

/** A {@link ClientConfig} with every default filled in. */
export type ResolvedConfig = Required<Omit<ClientConfig, "onUnattributed">> & Pick<ClientConfig, "onUnattributed">;

const SESSION_ID = /^[A-Za-z0-9_-]{1,128}$/;

/** Reports whether `id` is a valid session id: 1 to 128 of A-Z, a-z, 0-9, `_` and `-`. */
export function validSessionId(id: string): boolean {
  return SESSION_ID.test(id);
}

/**
 * The name of the events stream the processor provisions for `prefix`: the
 * prefix upper-cased, `.` and `-` as `_`, then `_EVENTS`
 * (`SEAMGUARD_EVENTS` for the default prefix).
 */
export function streamName(prefix: string = Defaults.prefix): string {
  return (prefix === "" ? Defaults.prefix : prefix).toUpperCase().replace(/[.-]/g, "_") + "_EVENTS";
}

/** The subjects of one prefix. */
export interface Subjects {
  /** `<prefix>.events.<session>`: where a session's events go. */
  events(session: string): string;
  /** `<prefix>.verdicts.<session>.<kind>`; kind `*` matches every kind. */
  verdicts(session: string, kind: string): string;
  /** `<prefix>.recover.<session>`: the processor's recover service. */
  recover(session: string): string;
}

/** Returns the subjects of `prefix`. */
export function subjects(prefix: string = Defaults.prefix): Subjects {
  const p = prefix === "" ? Defaults.prefix : prefix;
  return {
    events: (session) => `${p}.events.${session}`,
    verdicts: (session, kind) => `${p}.verdicts.${session}.${kind}`,
    recover: (session) => `${p}.recover.${session}`,
  };
}

// Control characters: C0, DEL and C1.
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/**
 * Reports every problem with `config` at once: an empty list when it is
 * valid.
 */
export function validateConfig(config: ClientConfig): string[] {
  const problems: string[] = [];
  const prefix = config.prefix ?? "";
  if (prefix !== "") {
    prefix.split(".").forEach((tok, i) => {
      if (tok === "") {
        problems.push(`prefix ${JSON.stringify(prefix)}: token ${i + 1} is empty`);
      } else if (/[*>\s]/.test(tok)) {
        problems.push(`prefix ${JSON.stringify(prefix)}: token ${JSON.stringify(tok)} holds a wildcard or white space`);
      }
    });
  }
  if (config.stream !== undefined && config.stream !== "" && (/[.*>\s]/.test(config.stream) || CONTROL.test(config.stream))) {
    problems.push(
      `stream ${JSON.stringify(config.stream)} may not hold '.', '*', '>' or white space; use the events stream's name, such as SEAMGUARD_EVENTS`,
    );
  }
  if (config.source !== undefined && CONTROL.test(config.source)) {
    problems.push(`source ${JSON.stringify(config.source)} holds a control character; use a URI such as urn:agent:<name>`);
  }
  const positive = (name: string, v: number | undefined, def: number, integer: boolean): void => {
    if (v === undefined) return;
    if (!Number.isFinite(v) || v < 0 || (integer && !Number.isInteger(v))) {
      problems.push(`${name} is ${v}; it must be 0 (the default, ${def}) or a positive ${integer ? "integer" : "number"}`);
    }
  };
  positive("ackTimeoutMs", config.ackTimeoutMs, Defaults.ackTimeoutMs, false);
  positive("publishAttempts", config.publishAttempts, Defaults.publishAttempts, true);
  positive("verdictTimeoutMs", config.verdictTimeoutMs, Defaults.verdictTimeoutMs, false);
  if (config.trustedKeys !== undefined && !Array.isArray(config.trustedKeys)) {
    problems.push("trustedKeys must be a list of public NKeys");
  } else {
    problems.push(...parseTrustedKeys(config.trustedKeys).problems);
  }
  if (config.onUnattributed !== undefined && typeof config.onUnattributed !== "function") {
    problems.push("onUnattributed must be a function");
  }
  return problems;
}

/**
 * Returns `config` with every default filled in, or throws an
 * {@link ArgumentError} naming every problem.
 */
export function resolveConfig(config: ClientConfig = {}): ResolvedConfig {
  const problems = validateConfig(config);
  if (problems.length > 0) {
    throw new ArgumentError(`seamguard: invalid client configuration: ${problems.join("; ")}`);
  }
  const prefix = config.prefix || Defaults.prefix;
  return {
    prefix,
    stream: config.stream || streamName(prefix),
    source: config.source || Defaults.source,
    structured: config.structured ?? false,
    ackTimeoutMs: config.ackTimeoutMs || Defaults.ackTimeoutMs,
    publishAttempts: config.publishAttempts || Defaults.publishAttempts,
    verdictTimeoutMs: config.verdictTimeoutMs || Defaults.verdictTimeoutMs,
    trustedKeys: parseTrustedKeys(config.trustedKeys).keys,
    ...(config.onUnattributed === undefined ? {} : { onUnattributed: config.onUnattributed }),
  };
}
