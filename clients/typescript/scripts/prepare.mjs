// The prepare script: compiles src alone (tsconfig.build.json) into
// dist/src, what the package exports, after removing what an earlier build
// left there. npm runs it after `npm ci` or `npm install` in this directory,
// before `npm pack`, and when another project installs this directory
// (`npm install <path>`, which links it). In that last case npm does not
// install this directory's own dependencies: say so, rather than fail with
// "tsc: not found".

import { execFileSync } from "node:child_process";
import { rmSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
let tsc;
try {
  tsc = createRequire(join(pkg, "package.json")).resolve("typescript/bin/tsc");
} catch {
  console.error(
    `@seamguard/client: cannot build dist/src: the package's dependencies are not installed in ${pkg}.\n` +
      "Run `npm ci` there first (npm links a package installed from a directory and does not install\n" +
      "that directory's dependencies), or install the packed package: `npm pack` there, then\n" +
      "`npm install <that directory>/seamguard-client-<version>.tgz` in your project.",
  );
  process.exit(1);
}
rmSync(join(pkg, "dist", "src"), { recursive: true, force: true });
execFileSync(process.execPath, [tsc, "-p", join(pkg, "tsconfig.build.json")], { stdio: "inherit" });
