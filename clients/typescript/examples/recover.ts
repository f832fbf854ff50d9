/**
 * Recovering a spill: the transcript seamguard kept when it refused a
 * compaction, read through the processor's recover service (the agent needs
 * no JetStream access), written to a file, every object's size and
 * SHA-256 digest checked.
 *
 *     node dist/examples/recover.js [nats://127.0.0.1:4222]
 */

import { open } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

import { connect, type NatsConnection } from "@nats-io/transport-node";

import {
  DigestMismatchError,
  NotRecoveredError,
  SeamguardClient,
  SpillForbiddenError,
  SpillNotFoundError,
  type SpillHandle,
} from "../src/index.js";

/**
 * Plays the seed story as session `id`, then recovers the spill of its
 * refusal into `path`. Returns the chain read (oldest first) and the
 * recovered lines.
 */
export async function recoverExample(nc: NatsConnection, id: string, path: string): Promise<{ chain: SpillHandle[]; lines: number }> {
  const client = new SeamguardClient(nc);
  const s = await client.open({ id, span: 12 });
  await s.append({ role: "user", content: "Do not touch anything under /etc." });
  for (let i = 1; i < 52; i++) await s.append({ content: `step ${i}` });
  await s.truncated({ start: 0, end: 8 }, "budget");
  const v = await s.compact({ summarizerInput: { start: 8, end: 52 }, summaryRange: { start: 8, end: 40 }, tailStart: 40 });
  // The allowed retry names the spill that cured it; so does the refusal.
  const handle = v.kind === "allowed" ? v.data.recoveredBy[0] : undefined;
  if (handle === undefined) throw new Error(`expected an allowed compaction cured by a spill, got ${v.kind}`);
  await s.commit(v.request.requestId);
  await s.close();

  const file = await open(path, "w");
  try {
    // Bytes are written as they arrive; each object's digest is checked at
    // its end. After an error, discard the file.
    const chain = await client.recover(id, handle, async (chunk) => {
      await file.write(chunk);
    });
    await file.sync();
    const { size } = await file.stat();
    const total = chain.reduce((n, h) => n + h.size, 0);
    if (size !== total) throw new Error(`wrote ${size} bytes of ${total}`);
    return { chain, lines: chain.reduce((n, h) => n + h.events, 0) };
  } catch (err) {
    if (err instanceof SpillNotFoundError) console.error(`no such spill: ${err.spill}`);
    else if (err instanceof SpillForbiddenError) console.error(`${err.spill} is a spill of another session`);
    else if (err instanceof DigestMismatchError) console.error(`the bytes are not what the handle names: ${err.message}`);
    else if (err instanceof NotRecoveredError) console.error(`not recovered (no processor answered in time?): ${err.message}`);
    throw err;
  } finally {
    await file.close();
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const nc = await connect({ servers: process.argv[2] ?? process.env["NATS_URL"] ?? "nats://127.0.0.1:4222" });
  try {
    const path = join(tmpdir(), `transcript-${Date.now()}.jsonl`);
    const r = await recoverExample(nc, `recover-${Date.now()}`, path);
    console.log(`recovered ${r.lines} events from ${r.chain.map((h) => h.name).join(", ")} into ${path}`);
  } finally {
    await nc.close();
  }
}
