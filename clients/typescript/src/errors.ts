/**
 * The client's errors. Every error the client throws on purpose is a
 * {@link SeamguardError}; test for a kind with `instanceof` or with its
 * `code`. Each keeps the error that caused it as `cause`.
 *
 * @module
 */

import type { Unattributed } from "./config.js";
import type { EventRejected } from "./types.js";

/** The `code` of every error the client throws on purpose. */
export type ErrorCode =
  | "invalid_argument"
  | "not_published"
  | "session_closed"
  | "no_verdict"
  | "not_retryable"
  | "rejected"
  | "not_recovered";

/** The base of the client's errors. */
export class SeamguardError extends Error {
  /** Which kind of error this is. */
  readonly code: ErrorCode;

  /** @internal */
  constructor(code: ErrorCode, message: string, options?: ErrorOptions) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** An argument is out of range or malformed; nothing was published. */
export class ArgumentError extends SeamguardError {
  /** @internal */
  constructor(message: string, options?: ErrorOptions) {
    super("invalid_argument", message, options);
  }
}

/**
 * An event could not be stored in the events stream. The session keeps it
 * and publishes it again, with the same id, before its next event (or on
 * {@link Session.flush}); nothing later overtakes it.
 */
export class NotPublishedError extends SeamguardError {
  /** The session of the event. */
  readonly session: string;
  /** The id of the event that was not stored. */
  readonly eventId: string;
  /** That event's CloudEvents type. */
  readonly eventType: string;
  /** The subject it was published on. */
  readonly subject: string;
  /** The stream it was expected to land in. */
  readonly stream: string;
  /** What went wrong, without the event's description. */
  readonly detail: string;
  /**
   * True when the event is the call's own: it is kept and counts (an
   * appended turn moved the head past it), and it is sent again, same id,
   * before anything else. False when the call's own event was not even
   * built, because the earlier event {@link NotPublishedError.eventId} is
   * still unpublished: the call changed nothing.
   */
  readonly kept: boolean;
  /**
   * True when the events stream answered the event's first publish as a
   * duplicate: it holds another message under the event's `Nats-Msg-Id`
   * (`msgId` of the source and id) and did not store this one.
   */
  msgIdTaken = false;

  /** @internal */
  constructor(
    session: string,
    eventId: string,
    eventType: string,
    subject: string,
    stream: string,
    detail: string,
    options?: ErrorOptions,
    kept = true,
  ) {
    super(
      "not_published",
      `seamguard: event not published: ${eventType} event ${eventId} of session ${session} on ${subject} (stream ${stream}): ${detail}`,
      options,
    );
    this.session = session;
    this.eventId = eventId;
    this.eventType = eventType;
    this.subject = subject;
    this.stream = stream;
    this.detail = detail;
    this.kept = kept;
  }
}

/** The session was closed with {@link Session.close}. */
export class SessionClosedError extends SeamguardError {
  /** The session. */
  readonly session: string;

  /** @internal */
  constructor(session: string, what: string) {
    super("session_closed", `seamguard: session ${session} is closed: ${what}`);
    this.session = session;
  }
}

/**
 * The verdict of a compaction request did not arrive before its deadline
 * (or its signal was aborted). The verdict, once the processor decides it,
 * is still in the verdict stream.
 */
export class NoVerdictError extends SeamguardError {
  /** The session. */
  readonly session: string;
  /** The request id of the compaction. */
  readonly requestId: string;
  /** The id of the `compaction.requested` event that was published. */
  readonly eventId: string;
  /**
   * The messages that claimed to answer the request while the client
   * waited and failed verification (forgeries, or verdicts signed by a key
   * not trusted); empty when none came.
   */
  readonly unattributed: readonly Unattributed[];

  /** @internal */
  constructor(
    session: string,
    requestId: string,
    eventId: string,
    reason: string,
    options?: ErrorOptions,
    unattributed: readonly Unattributed[] = [],
  ) {
    super(
      "no_verdict",
      `seamguard: no verdict for compaction request ${JSON.stringify(requestId)} of session ${session} (event ${eventId}): ${reason}`,
      options,
    );
    this.session = session;
    this.requestId = requestId;
    this.eventId = eventId;
    this.unattributed = unattributed;
  }
}

/**
 * {@link Session.retry} was given a verdict that is not a refusal with
 * next `retry`, or {@link Session.carryPins} one that is not a refusal with
 * next `carry_pins`.
 */
export class NotRetryableError extends SeamguardError {
  /** @internal */
  constructor(message: string) {
    super("not_retryable", message);
  }
}

/**
 * seamguard rejected an event of this client (it was not a valid event):
 * the `event.rejected` verdict. Thrown by a compaction request whose
 * event was rejected; given to {@link SessionOptions.onRejected} for the
 * session's other events.
 */
export class RejectedError extends SeamguardError {
  /** The session. */
  readonly session: string;
  /** The id of the rejected event. */
  readonly eventId: string;
  /** The rejection: its code, the field at fault, the message. */
  readonly rejection: EventRejected;
  /** The public NKey that signed the rejection (it was verified as any verdict is). */
  readonly signer: string;
  /**
   * For a rejected compaction request: the messages that claimed to
   * answer it while the client waited and failed verification. Empty for
   * the rejections {@link SessionOptions.onRejected} is given.
   */
  readonly unattributed: readonly Unattributed[];

  /** @internal */
  constructor(session: string, eventId: string, rejection: EventRejected, signer = "", unattributed: readonly Unattributed[] = []) {
    super(
      "rejected",
      `seamguard rejected event ${eventId} of session ${session}: ${rejection.code} (field ${JSON.stringify(rejection.field)}): ${rejection.message}`,
    );
    this.session = session;
    this.eventId = eventId;
    this.rejection = rejection;
    this.signer = signer;
    this.unattributed = unattributed;
  }
}

/**
 * A spill's transcript was not recovered whole: what the sink received
 * before the error is not to be trusted. The subclasses say why; a plain
 * NotRecoveredError means the recover service did not answer in time (or
 * the signal was aborted) or the sink failed.
 */
export class NotRecoveredError extends SeamguardError {
  /** The session asked on. */
  readonly session: string;
  /** The spill asked for. */
  readonly spill: string;

  /** @internal */
  constructor(session: string, spill: string, message: string, options?: ErrorOptions) {
    super("not_recovered", message, options);
    this.session = session;
    this.spill = spill;
  }
}

/**
 * A refusal by seamguard's recover service, with the code and message it
 * sent (micro's `Nats-Service-Error-Code` and `Nats-Service-Error`
 * headers): 400 malformed, 403 a spill of another session, 404 no such
 * spill, 409 written again since the cursor, 413 request too large, 500 a
 * damaged object or JetStream failure, 503 busy or stopping.
 */
export class RecoverServiceError extends NotRecoveredError {
  /** The service's status code. */
  readonly status: number;
  /** The service's message. */
  readonly serviceMessage: string;

  /** @internal */
  constructor(session: string, spill: string, status: number, serviceMessage: string) {
    super(
      session,
      spill,
      `seamguard's recover service refused spill ${spill} of session ${session}: ${status} ${serviceMessage}`,
    );
    this.status = status;
    this.serviceMessage = serviceMessage;
  }
}

/** The session has no spill of that name (the recover service answered 404). */
export class SpillNotFoundError extends RecoverServiceError {}

/** The spill is not one of the session asked on (the recover service answered 403). */
export class SpillForbiddenError extends RecoverServiceError {}

/**
 * What was read is not what the spill's handle names: another size or
 * SHA-256 digest, for one object of the chain or the object the caller's
 * handle names.
 */
export class DigestMismatchError extends NotRecoveredError {}

/**
 * The spills' chain cannot be followed (a loop, links out of order, more
 * than 10,000 spills), or the service's answers do not fit the protocol.
 */
export class BrokenChainError extends NotRecoveredError {}
