/**
 * The refuse, spill, retry flow and the carry_pins flow step by step, with
 * `requestCompaction`, `retry` and `carryPins` (`compact` does all of this
 * in one call).
 *
 *     node dist/examples/refuse-spill-retry.js [nats://127.0.0.1:4222]
 */

import { pathToFileURL } from "node:url";

import { connect, type NatsConnection } from "@nats-io/transport-node";

import { SeamguardClient, isRetryable, mustCarryPins, type SpillHandle, type Verdict } from "../src/index.js";

/** What the flow went through. */
export interface FlowResult {
  steps: Verdict[];
  /** The spill that keeps what the compaction drops. */
  spill: SpillHandle | null;
}

/**
 * Plays the seed story as session `id` with the user's rule (turn 0)
 * pinned, and follows each refusal by hand.
 */
export async function refuseSpillRetry(nc: NatsConnection, id: string): Promise<FlowResult> {
  const client = new SeamguardClient(nc, { structured: true }); // structured content mode, for a change
  const s = await client.open({ id, span: 12 });
  await s.append({ role: "user", content: "Do not touch anything under /etc.", pinned: true }); // a rule: keep it in context
  for (let i = 1; i < 52; i++) await s.append({ content: `step ${i}` });
  await s.truncated({ start: 0, end: 8 }, "budget");

  const steps: Verdict[] = [];
  let spill: SpillHandle | null = null;
  let v = await s.requestCompaction({ summarizerInput: { start: 8, end: 52 }, summaryRange: { start: 8, end: 40 }, tailStart: 40 });
  for (let i = 0; i < 4; i++) {
    steps.push(v);
    if (v.kind === "refused" && v.data.spill !== null) spill = v.data.spill; // keep it: it holds the evicted turns
    if (mustCarryPins(v)) {
      // The compaction would drop pinned turns: put them back into the new
      // context verbatim (outside the summary) and say so.
      // (droppedPins(v) names them; the allowed verdict's request.carriedPins too.)
      v = await s.carryPins(v);
    } else if (isRetryable(v)) {
      // seamguard spilled the transcript: the same compaction is now allowed.
      v = await s.retry(v);
    } else {
      break;
    }
  }
  if (v.kind === "allowed") await s.commit(v.request.requestId);
  await s.close();
  return { steps, spill };
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const nc = await connect({ servers: process.argv[2] ?? process.env["NATS_URL"] ?? "nats://127.0.0.1:4222" });
  try {
    const r = await refuseSpillRetry(nc, `refuse-spill-retry-${Date.now()}`);
    for (const v of r.steps) {
      const why = v.kind === "refused" ? ` (${v.data.reasons.map((x) => x.code).join(", ")}; next ${v.data.next})` : "";
      const carried = (v.request.carriedPins ?? []).map((p) => `[${p.start}, ${p.end})`).join(", ");
      console.log(`${v.request.requestId}: ${v.kind}${why}${carried ? `, carrying pinned ${carried}` : ""}`);
    }
    if (r.spill) console.log(`spill ${r.spill.name}: ${r.spill.size} bytes, ${r.spill.digest}`);
  } finally {
    await nc.close();
  }
}
