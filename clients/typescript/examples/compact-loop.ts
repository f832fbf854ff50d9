/**
 * The basic compact loop: open a session, append turns, report what budget
 * enforcement evicted, ask seamguard before compacting, apply and commit
 * only an allowed compaction, close.
 *
 *     node dist/examples/compact-loop.js [nats://127.0.0.1:4222]
 */

import { pathToFileURL } from "node:url";

import { connect, type NatsConnection } from "@nats-io/transport-node";

import { NoVerdictError, SeamguardClient, type Verdict } from "../src/index.js";

/** Plays the seed story's shape as session `id` and returns the last verdict. */
export async function compactLoop(nc: NatsConnection, id: string): Promise<Verdict> {
  const client = new SeamguardClient(nc, { source: "urn:agent:billing/worker-3" });
  const s = await client.open({ id, span: 12 }); // floor: the last 12 turns survive every compaction

  await s.append({ role: "user", content: "Rotate the TLS certificate of the billing API. Do not touch anything under /etc." });
  for (let i = 1; i < 52; i++) {
    await s.append({ role: i % 2 ? "assistant" : "tool", content: `step ${i}` }); // at the head; the session counts offsets
  }
  await s.truncated({ start: 0, end: 8 }, "budget"); // budget enforcement evicted the 8 oldest turns

  try {
    const v = await s.compact(
      { requestId: "compact-1", summarizerInput: { start: 8, end: 52 }, summaryRange: { start: 8, end: 40 }, tailStart: 40 },
      { timeoutMs: 10_000 },
    );
    switch (v.kind) {
      case "allowed":
        // Apply the compaction, then tell seamguard. v.previous, if set, is
        // the refusal whose spill holds what the summary drops.
        await s.commit(v.request.requestId);
        break;
      case "refused": // next "none": the request itself is wrong; do not compact
        console.error(`refused: ${v.data.reasons.map((r) => r.message).join("; ")}`);
        break;
      case "halted": // nothing can recover what it drops; an operator must look
        console.error(`halted: ${v.data.message}`);
        break;
    }
    return v;
  } catch (err) {
    if (err instanceof NoVerdictError) {
      console.error(`no verdict for ${err.requestId}: do not compact yet`);
    }
    throw err;
  } finally {
    await s.close();
  }
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const nc = await connect({ servers: process.argv[2] ?? process.env["NATS_URL"] ?? "nats://127.0.0.1:4222" });
  try {
    const v = await compactLoop(nc, `compact-loop-${Date.now()}`);
    console.log(`${v.request.requestId}: ${v.kind}${v.previous ? ` after ${v.previous.kind}` : ""}`);
  } finally {
    await nc.close();
  }
}
