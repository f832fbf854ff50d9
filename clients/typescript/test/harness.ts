/**
 * The real thing, for the tests: `seamguard serve` (built from this
 * repository by run.ts) as a child process on a free loopback port with a
 * temporary data directory, and, for the least-privilege tests, a
 * nats-server loaded with deploy/nats/standalone.conf (internal/testnats).
 * Every process started here is stopped by its PID, and every temporary
 * directory removed.
 */

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { appendFileSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import { connect, type NatsConnection, type NodeConnectionOptions } from "@nats-io/transport-node";

/** The repository's root: clients/typescript/dist/test is four levels down. */
export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** The binaries the tests run. */
export interface Binaries {
  seamguard: string;
  testnats: string;
}

let built: Binaries | undefined;

/**
 * The binaries run.ts built (SEAMGUARD_BIN, SEAMGUARD_TESTNATS), or, when a
 * test file runs on its own, builds them once into a temporary directory
 * removed at exit.
 */
export function binaries(): Binaries {
  const seamguard = process.env["SEAMGUARD_BIN"];
  const testnats = process.env["SEAMGUARD_TESTNATS"];
  if (seamguard && testnats) return { seamguard, testnats };
  if (built !== undefined) return built;
  const dir = mkdtempSync(join(tmpdir(), "seamguard-ts-bin-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  built = buildBinaries(dir);
  return built;
}

/** Builds seamguard and testnats from the repository into `dir`. */
export function buildBinaries(dir: string): Binaries {
  const b = { seamguard: join(dir, "seamguard"), testnats: join(dir, "testnats") };
  execFileSync("go", ["build", "-o", b.seamguard, "./cmd/seamguard"], { cwd: repoRoot, stdio: "inherit" });
  execFileSync("go", ["build", "-o", b.testnats, "./internal/testnats"], { cwd: repoRoot, stdio: "inherit" });
  return b;
}

// Children still running when the process exits are killed by PID; run.ts
// also kills whatever a crashed test process left (SEAMGUARD_TS_PIDFILE).
const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of live) {
    if (c.pid !== undefined && c.exitCode === null && c.signalCode === null) {
      try {
        process.kill(c.pid, "SIGKILL");
      } catch {
        // gone already
      }
    }
  }
});

function track(c: ChildProcess, binary: string): void {
  live.add(c);
  c.once("exit", () => live.delete(c));
  const pidfile = process.env["SEAMGUARD_TS_PIDFILE"];
  if (pidfile && c.pid !== undefined) appendFileSync(pidfile, `${c.pid} ${binary}\n`);
}

/** Stops a child by its PID: SIGTERM, then SIGKILL after `graceMs`. */
async function stopChild(c: ChildProcess, graceMs = 30_000): Promise<number | null> {
  if (c.exitCode !== null || c.signalCode !== null) return c.exitCode;
  const exited = new Promise<number | null>((res) => c.once("exit", (code) => res(code)));
  if (c.pid !== undefined) process.kill(c.pid, "SIGTERM");
  const timer = setTimeout(() => {
    if (c.pid !== undefined && c.exitCode === null) process.kill(c.pid, "SIGKILL");
  }, graceMs);
  const code = await exited;
  clearTimeout(timer);
  return code;
}

/**
 * Reads a child's standard output and error line by line, keeps the last
 * 400 lines for diagnostics (and the pipes drained), and lets a caller wait
 * for a line.
 */
class Lines {
  readonly log: string[] = [];
  readonly #seen: Record<"stdout" | "stderr", string[]> = { stdout: [], stderr: [] };
  readonly #waiters = new Set<() => void>();
  #exited: number | null | undefined;

  constructor(c: ChildProcess) {
    for (const name of ["stdout", "stderr"] as const) {
      const src = c[name];
      if (src === null) continue;
      createInterface({ input: src }).on("line", (line) => {
        this.log.push(line);
        if (this.log.length > 400) this.log.shift();
        const seen = this.#seen[name];
        if (seen.length < 400) seen.push(line);
        for (const w of this.#waiters) w();
      });
    }
    c.once("exit", (code) => {
      this.#exited = code;
      for (const w of this.#waiters) w();
    });
  }

  /** Waits for a line of `stream` matching `re`, or rejects after `ms` or when the child exits. */
  waitFor(stream: "stdout" | "stderr", re: RegExp, ms: number): Promise<RegExpExecArray> {
    return new Promise((res, rej) => {
      const check = (): boolean => {
        for (const line of this.#seen[stream]) {
          const m = re.exec(line);
          if (m !== null) {
            done();
            res(m);
            return true;
          }
        }
        if (this.#exited !== undefined) {
          done();
          rej(new Error(`the process exited (${this.#exited}) before printing a line matching ${re}; output:\n${this.log.join("\n")}`));
          return true;
        }
        return false;
      };
      const timer = setTimeout(() => {
        done();
        rej(new Error(`no line matching ${re} on ${stream} within ${ms} ms; output so far:\n${this.log.join("\n")}`));
      }, ms);
      const waiter = (): void => {
        check();
      };
      const done = (): void => {
        clearTimeout(timer);
        this.#waiters.delete(waiter);
      };
      if (!check()) this.#waiters.add(waiter);
    });
  }
}

/** A running `seamguard serve`. */
export interface Serve {
  /** The NATS URL agents connect to. */
  readonly url: string;
  /** The process id. */
  readonly pid: number;
  /** What it logged (the last lines). */
  readonly log: string[];
  /** The public NKey that signs its verdicts, as it logged it. */
  readonly signingKey: string;
  /** Stops it (SIGTERM: it drains) and removes its data directory (when it made one). */
  stop(): Promise<void>;
}

/** Options of {@link startServe}. */
export interface ServeOptions {
  /** An external NATS server; without it serve starts its embedded one. */
  natsUrl?: string;
  user?: string;
  password?: string;
  /** Extra flags. */
  args?: string[];
}

async function waitReady(healthUrl: string, log: string[], ms = 30_000): Promise<void> {
  const readyz = healthUrl.replace(/\/healthz$/, "/readyz");
  const deadline = Date.now() + ms;
  let last = "";
  while (Date.now() < deadline) {
    try {
      const r = await fetch(readyz);
      if (r.status === 200) return;
      last = `${r.status} ${await r.text()}`;
    } catch (err) {
      last = String(err);
    }
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`seamguard serve not ready after ${ms} ms (${last}); log:\n${log.join("\n")}`);
}

/**
 * Starts `seamguard serve` on a free loopback port with a temporary data
 * directory (embedded NATS), or against `natsUrl`, and waits until
 * `/readyz` answers 200.
 */
export async function startServe(opts: ServeOptions = {}): Promise<Serve> {
  const bin = binaries().seamguard;
  // The data directory holds the signing key serve makes, and the embedded
  // server's store.
  const dir = mkdtempSync(join(tmpdir(), "seamguard-ts-serve-"));
  const args = ["serve", "--health-listen", "127.0.0.1:0", "--lease-ttl", "2s", "--drain-timeout", "10s", "--data-dir", join(dir, "data")];
  if (opts.natsUrl) {
    args.push("--nats-url", opts.natsUrl);
    if (opts.user) args.push("--user", opts.user);
    if (opts.password) args.push("--password", opts.password);
  } else {
    args.push("--listen", "127.0.0.1:0", "--sync-interval", "2m");
  }
  args.push("--log-format", "text", "--log-level", "info", ...(opts.args ?? []));
  // serve reads a SEAMGUARD_<FLAG> variable for every flag: none of the
  // caller's may change what the tests start.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("SEAMGUARD_")));
  const c = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env });
  track(c, bin);
  const lines = new Lines(c);
  const cleanup = async (): Promise<void> => {
    await stopChild(c);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const [served, health] = await Promise.all([
      lines.waitFor("stdout", /^seamguard serving on (nats:\/\/\S+?):? /, 60_000),
      lines.waitFor("stderr", /msg="health endpoints" url=(\S+)/, 60_000),
    ]);
    await waitReady(health[1] as string, lines.log);
    const key = lines.log.map((l) => /signing_key=(N[A-Z2-7]{55})/.exec(l)?.[1]).find((k) => k !== undefined);
    if (key === undefined) throw new Error(`seamguard serve logged no signing_key; log:\n${lines.log.join("\n")}`);
    return { url: served[1] as string, pid: c.pid as number, log: lines.log, signingKey: key, stop: cleanup };
  } catch (err) {
    await cleanup();
    throw err;
  }
}

/** A nats-server loaded with deploy/nats/standalone.conf. */
export interface TestNats {
  readonly url: string;
  readonly pid: number;
  /** The passwords of the three identities. */
  readonly passwords: { agent: string; processor: string; responder: string; operator: string; forwarder: string };
  stop(): Promise<void>;
}

/**
 * Starts the shipped deploy/nats/standalone.conf (accounts.conf,
 * permissions.conf) on a free loopback port, with a temporary store and
 * passwords of its own.
 */
export async function startTestNats(): Promise<TestNats> {
  const bin = binaries().testnats;
  const dir = mkdtempSync(join(tmpdir(), "seamguard-ts-nats-"));
  const passwords = { agent: "agent-ts-test", processor: "processor-ts-test", responder: "responder-ts-test", operator: "operator-ts-test", forwarder: "forwarder-ts-test" };
  const c = spawn(
    bin,
    ["-c", join(repoRoot, "deploy/nats/standalone.conf"), "-store", join(dir, "store"), "-port", "0", "-sync", "2m", "-stdin-eof"],
    {
      stdio: ["pipe", "pipe", "pipe"],
      env: {
        ...process.env,
        NATS_AGENT_PASSWORD: passwords.agent,
        NATS_PROCESSOR_PASSWORD: passwords.processor,
        NATS_RESPONDER_PASSWORD: passwords.responder,
        NATS_OPERATOR_PASSWORD: passwords.operator,
        NATS_FORWARDER_PASSWORD: passwords.forwarder,
      },
    },
  );
  track(c, bin);
  const lines = new Lines(c);
  const cleanup = async (): Promise<void> => {
    await stopChild(c);
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    const m = await lines.waitFor("stdout", /^(nats:\/\/\S+)$/, 30_000);
    return { url: m[1] as string, pid: c.pid as number, passwords, stop: cleanup };
  } catch (err) {
    await cleanup();
    throw err;
  }
}

/** Connects to `url`; the caller closes the connection. */
export function natsConnect(url: string, opts: Partial<NodeConnectionOptions> = {}): Promise<NatsConnection> {
  return connect({ servers: url, ...opts });
}

/** A turn of a story file: its role, tokens and content. */
export interface StoryTurn {
  role: string;
  tokens: number;
  content: string;
}

/**
 * The turns of a story under testdata/stories (for example
 * seed-story.jsonl), in order.
 */
export function storyTurns(name: string): StoryTurn[] {
  const text = readFileSync(join(repoRoot, "testdata/stories", name), "utf8");
  const turns: StoryTurn[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    const ev = JSON.parse(line) as { type?: string; data?: { role?: string; tokens?: number; content?: string } };
    if (ev.type === "io.seamguard.turn.appended" && ev.data) {
      turns.push({ role: ev.data.role ?? "", tokens: ev.data.tokens ?? 0, content: ev.data.content ?? "" });
    }
  }
  return turns;
}

/** Polls `fn` until it returns a value other than undefined, or throws after `ms`. */
export async function eventually<T>(fn: () => T | undefined | Promise<T | undefined>, ms: number, what: string): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await new Promise((res) => setTimeout(res, 20));
  }
}
