/**
 * `npm test`: builds seamguard and testnats from this repository once,
 * into a temporary directory, runs every test file with Node's test runner
 * (each file starts the processes it needs), then kills anything a crashed
 * test process left running (by PID) and removes the directory. Arguments
 * go to `node --test` (for example `npm test -- --test-name-pattern=seed`).
 */

import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { buildBinaries } from "./harness.js";

const here = dirname(fileURLToPath(import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "seamguard-ts-test-"));
const pidfile = join(dir, "pids");
writeFileSync(pidfile, "");
let status = 1;
try {
  const t0 = Date.now();
  const bins = buildBinaries(dir);
  console.log(`built seamguard and testnats in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  const files = readdirSync(here)
    .filter((f) => f.endsWith(".test.js"))
    .sort()
    .map((f) => join(here, f));
  const r = spawnSync(process.execPath, ["--test", "--test-concurrency=2", "--test-reporter=spec", ...process.argv.slice(2), ...files], {
    stdio: "inherit",
    env: { ...process.env, SEAMGUARD_BIN: bins.seamguard, SEAMGUARD_TESTNATS: bins.testnats, SEAMGUARD_TS_PIDFILE: pidfile },
  });
  status = r.status ?? 1;
  console.log(`tests took ${((Date.now() - t0) / 1000).toFixed(1)} s in all (build included)`);
} finally {
  // Whatever a test process left running when it crashed: stop it by its
  // PID, if that PID still runs one of our binaries.
  for (const line of readFileSync(pidfile, "utf8").split("\n")) {
    const [pid, bin] = line.split(" ");
    if (!pid || !bin) continue;
    try {
      const exe = `/proc/${pid}/cmdline`;
      if (existsSync(exe) && readFileSync(exe, "utf8").startsWith(bin)) {
        process.kill(Number(pid), "SIGKILL");
        console.error(`killed ${bin} (pid ${pid}), left running by a test`);
      }
    } catch {
      // gone
    }
  }
  rmSync(dir, { recursive: true, force: true });
}
process.exit(status);
