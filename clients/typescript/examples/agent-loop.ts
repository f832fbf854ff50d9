/**
 * A minimal agent loop that asks seamguard before it compacts.
 *
 * The agent keeps a working context of verbatim turns under a token budget.
 * Budget enforcement evicts the oldest turns when the context overflows, and
 * tells seamguard (`truncated`). When the context passes the compaction
 * threshold, the agent wants to summarize all but the last few turns: it
 * asks seamguard first (`compact`), applies the compaction only if it is
 * allowed, and then commits it. A refusal with a spill is retried by
 * `compact` itself; the spill keeps what the summary drops.
 *
 * Run it against a seamguard deployment (`go run ./cmd/seamguard serve`):
 *
 *     node dist/examples/agent-loop.js [nats://127.0.0.1:4222]
 *
 * test/example.test.ts runs `agentLoop` against a real processor.
 */

import { pathToFileURL } from "node:url";

import { connect, type NatsConnection } from "@nats-io/transport-node";

import { SeamguardClient, type Range, type SpillHandle, type Verdict } from "../src/index.js";

/** Tokens the working context may hold. */
const BUDGET = 2000;
/** Compact once the context holds more. */
const THRESHOLD = 1500;
/** The recovery floor: the last KEEP turns survive every compaction verbatim. */
const KEEP = 4;

/** One turn of the agent's conversation. */
export interface ScriptedTurn {
  role: "user" | "assistant" | "tool";
  text: string;
  tokens: number;
}

/** What the loop did. */
export interface LoopResult {
  /** Compactions applied (allowed, then committed). */
  compactions: number;
  /** Compactions seamguard refused for good (the agent kept its context). */
  refused: number;
  /** Spills written for the compactions applied: what their summaries drop. */
  spills: SpillHandle[];
  /** Every verdict `compact` returned, in order. */
  verdicts: Verdict[];
  /** The working context at the end: the summary, then the verbatim turns. */
  context: string[];
}

/** The seed story, shortened: a rule, a plan, tool output, one huge log. */
export function scriptedTurns(): ScriptedTurn[] {
  const turns: ScriptedTurn[] = [
    { role: "user", text: "Rotate the TLS certificate of the billing API. Do not touch anything under /etc.", tokens: 40 },
    { role: "assistant", text: "Plan: read /srv/billing/tls, issue a new certificate there, reload the service.", tokens: 60 },
  ];
  for (let i = 0; i < 6; i++) {
    turns.push({ role: "tool", text: `ls /srv/billing, step ${i}`, tokens: 150 });
    turns.push({ role: "assistant", text: `checked step ${i}`, tokens: 30 });
  }
  turns.push({ role: "tool", text: "journalctl -u billing (a huge log)", tokens: 900 });
  for (let i = 0; i < 8; i++) {
    turns.push({ role: "assistant", text: `log chunk ${i} checked`, tokens: 40 });
    turns.push({ role: "tool", text: `openssl output ${i}`, tokens: 120 });
  }
  return turns;
}

interface Entry {
  range: Range;
  tokens: number;
  text: string;
}

const tokensOf = (ctx: Entry[]): number => ctx.reduce((n, e) => n + e.tokens, 0);

/** Runs the agent loop over `turns` as session `sessionId`. */
export async function agentLoop(nc: NatsConnection, sessionId: string, turns: ScriptedTurn[] = scriptedTurns()): Promise<LoopResult> {
  const client = new SeamguardClient(nc, { source: "urn:agent:example/agent-loop" });
  const session = await client.open({ id: sessionId, span: KEEP });
  const result: LoopResult = { compactions: 0, refused: 0, spills: [], verdicts: [], context: [] };
  let context: Entry[] = []; // the turns kept verbatim
  let summary: string | undefined; // a real agent keeps an LLM's summary here

  for (const t of turns) {
    const range = await session.append({ role: t.role, tokens: t.tokens, content: t.text });
    context.push({ range, tokens: t.tokens, text: t.text });

    // Budget enforcement: evict the oldest verbatim turns until the context fits, and say so.
    while (tokensOf(context) > BUDGET && context.length > KEEP) {
      const evicted = context.shift()!;
      await session.truncated(evicted.range, "budget");
    }

    // Compaction: summarize everything before the last KEEP turns, if seamguard allows it.
    if (tokensOf(context) > THRESHOLD && context.length > KEEP) {
      const first = context[0]!.range.start;
      const tailStart = context[context.length - KEEP]!.range.start;
      const v = await session.compact(
        {
          summarizerInput: { start: first, end: session.head }, // what the summarizer reads
          summaryRange: { start: 0, end: tailStart }, // what the new summary replaces
          tailStart, // [tailStart, head) stays verbatim
          carriesPriorSummary: summary !== undefined, // the new summary folds the old one in
        },
        { timeoutMs: 10_000 },
      );
      result.verdicts.push(v);
      if (v.kind !== "allowed") {
        result.refused++; // refused for good, or halted: keep the context as it is
        continue;
      }
      const spill = v.previous?.kind === "refused" ? v.previous.data.spill : null;
      if (spill !== null) result.spills.push(spill); // the transcript seamguard kept
      summary = `summary of [0, ${tailStart})`;
      context = context.slice(-KEEP);
      await session.commit(v.request.requestId);
      result.compactions++;
    }
  }
  await session.close();
  result.context = [...(summary ? [summary] : []), ...context.map((e) => e.text)];
  return result;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const nc = await connect({ servers: process.argv[2] ?? process.env["NATS_URL"] ?? "nats://127.0.0.1:4222" });
  try {
    const r = await agentLoop(nc, `agent-loop-${Date.now()}`);
    console.log(`${r.compactions} compaction(s) applied, ${r.refused} refused for good`);
    for (const s of r.spills) console.log(`spill ${s.name} (${s.size} bytes, ${s.digest}) keeps offsets [${s.range.start}, ${s.range.end})`);
    console.log("context now:", r.context);
  } finally {
    await nc.close();
  }
}
