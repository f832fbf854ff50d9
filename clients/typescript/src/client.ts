/**
 * The client: it opens sessions and recovers spills.
 *
 * @module
 */

import type { NatsConnection } from "@nats-io/transport-node";

import { resolveConfig, type ClientConfig, type ResolvedConfig, type Subjects } from "./config.js";
import { Core } from "./core.js";
import { ArgumentError } from "./errors.js";
import { Recovery, checkRecover, recoverToBuffer, type ChunkSink, type RecoverOptions, type RecoveredTranscript } from "./recover.js";
import { Session, validateSessionOptions, type CallOptions, type SessionOptions } from "./session.js";
import type { SpillHandle } from "./types.js";

/**
 * Publishes the events of agent sessions to seamguard and waits for its
 * verdicts. It holds no state of its own beyond its configuration: it may
 * open any number of sessions, used from any number of async tasks.
 *
 * It needs no JetStream API access: an identity that may publish on
 * `<prefix>.events.>` and `<prefix>.recover.>` and subscribe to
 * `<prefix>.verdicts.>` and `_INBOX.>` (the `agent` of deploy/nats) is
 * enough. The caller keeps owning the connection.
 *
 * ```ts
 * const nc = await connect({ servers: "nats://127.0.0.1:4222", user: "agent", pass });
 * const client = new SeamguardClient(nc, { source: "urn:agent:billing/worker-3" });
 * const s = await client.open({ id: "ops-agent-42", span: 12 });
 * ```
 */
export class SeamguardClient {
  readonly #core: Core;

  /**
   * Returns a client that publishes through `nc` with JetStream acks and
   * listens to verdicts on `nc`. Throws an {@link ArgumentError} naming
   * every problem with `config`.
   */
  constructor(nc: NatsConnection, config: ClientConfig = {}) {
    if (nc === null || nc === undefined) {
      throw new ArgumentError("seamguard: the NATS connection is missing; connect with connect() from @nats-io/transport-node first");
    }
    this.#core = new Core(nc, resolveConfig(config));
  }

  /** The configuration with every default filled in. */
  get config(): ResolvedConfig {
    return this.#core.config;
  }

  /** The subject names the client uses. */
  get subjects(): Subjects {
    return this.#core.subjects;
  }

  /**
   * Publishes `io.seamguard.session.opened` (the recovery floor's unit is
   * the session's) and returns the session. With `options.head` it resumes
   * a session opened before. Throws an {@link ArgumentError} naming every
   * problem with the options, or a {@link NotPublishedError}.
   */
  async open(options: SessionOptions, call: CallOptions = {}): Promise<Session> {
    const problems = validateSessionOptions(options);
    if (problems.length > 0) {
      throw new ArgumentError(`seamguard: invalid session: ${problems.join("; ")}`);
    }
    const s = new Session(this.#core, options.id, options.unit ?? "turns", options.head ?? 0, options.onRejected);
    await s.open(options, call);
    return s;
  }

  /**
   * {@link Session.recover} for a session this client has no Session of
   * (an agent that restarted): `session` is the session id the request's
   * subject names, and `handle` must be a spill of it.
   */
  recover(session: string, handle: SpillHandle, sink: ChunkSink, opts: RecoverOptions = {}): Promise<SpillHandle[]> {
    checkRecover(session, handle, sink);
    return new Recovery(this.#core, session, opts.signal).run(handle, sink);
  }

  /** {@link SeamguardClient.recover} into one buffer. */
  recoverTranscript(session: string, handle: SpillHandle, opts: RecoverOptions = {}): Promise<RecoveredTranscript> {
    return recoverToBuffer((sink) => this.recover(session, handle, sink, opts));
  }
}
