// The examples, run against a real `seamguard serve`: the minimal agent
// loop of docs/typescript.md, and one program per flow.

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import type { NatsConnection } from "@nats-io/transport-node";

import { agentLoop } from "../examples/agent-loop.js";
import { compactLoop } from "../examples/compact-loop.js";
import { recoverExample } from "../examples/recover.js";
import { refuseSpillRetry } from "../examples/refuse-spill-retry.js";
import { SeamguardClient } from "../src/index.js";
import { natsConnect, repoRoot, startServe, type Serve } from "./harness.js";

describe("examples", () => {
  let serve: Serve;
  let nc: NatsConnection;
  before(async () => {
    serve = await startServe();
    nc = await natsConnect(serve.url);
  });
  after(async () => {
    await nc?.close();
    await serve?.stop();
  });

  test("the minimal agent loop: the evicted rule is spilled before the first compaction, and recoverable", async () => {
    const r = await agentLoop(nc, "agent-loop");
    assert.equal(r.refused, 0);
    assert.equal(r.compactions, 2);
    // Budget enforcement evicted turns 0 and 1 (the user's rule, the plan)
    // before any summary saw them: the first compaction was refused with
    // coverage_hole, seamguard spilled the transcript, the retry was
    // allowed. The second compaction needed no new spill.
    const first = r.verdicts[0];
    assert.ok(first?.previous?.kind === "refused");
    assert.deepEqual(first.previous.data.reasons.map((x) => [x.code, x.atRisk]), [["coverage_hole", [{ start: 0, end: 2 }]]]);
    assert.equal(first.previous.data.next, "retry");
    assert.equal(r.verdicts[1]?.previous, undefined, "the second compaction is allowed at once");
    assert.equal(r.spills.length, 1);
    const spill = r.spills[0];
    assert.ok(spill !== undefined);
    assert.deepEqual(spill.range, { start: 0, end: 15 });
    const { transcript } = await new SeamguardClient(nc).recoverTranscript("agent-loop", spill);
    assert.match(Buffer.from(transcript).toString("utf8"), /Do not touch anything under \/etc/);
    assert.equal(r.context[0], "summary of [0, 17)");
  });

  test("compact-loop: allowed after a refusal that spilled", async () => {
    const v = await compactLoop(nc, "compact-loop");
    assert.equal(v.kind, "allowed");
    assert.equal(v.previous?.kind, "refused");
  });

  test("docs/typescript.md quotes the tested loop verbatim", () => {
    const docs = readFileSync(join(repoRoot, "docs/typescript.md"), "utf8");
    const example = readFileSync(join(repoRoot, "clients/typescript/examples/agent-loop.ts"), "utf8");
    const blocks = [...docs.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
    assert.ok(blocks.length >= 2);
    for (const b of blocks) assert.ok(example.includes(b), `not in examples/agent-loop.ts:\n${b}`);
  });

  test("refuse-spill-retry: carry_pins, then allowed with the pin carried", async () => {
    const r = await refuseSpillRetry(nc, "refuse-spill-retry");
    assert.deepEqual(
      r.steps.map((v) => [v.kind, v.kind === "refused" ? v.data.next : ""]),
      [
        ["refused", "carry_pins"],
        ["allowed", ""],
      ],
    );
    assert.deepEqual(r.steps[1]?.request.carriedPins, [{ start: 0, end: 1 }]);
    assert.ok(r.spill !== null);
  });

  test("recover: the chain into a file, digests checked", async () => {
    const dir = mkdtempSync(join(tmpdir(), "seamguard-ts-recover-"));
    try {
      const path = join(dir, "transcript.jsonl");
      const r = await recoverExample(nc, "recover-example", path);
      assert.equal(r.chain.length, 1);
      const lines = readFileSync(path, "utf8").trimEnd().split("\n");
      assert.equal(lines.length, r.lines);
      assert.match(lines[1] ?? "", /Do not touch anything under \/etc/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
