#!/usr/bin/env bash
# pack-check: @seamguard/client installs into another project and imports,
# as a fresh clone of the repository gets it. It copies the package's
# files (without node_modules and dist) and the repository's LICENSE into a
# temporary directory and runs npm ci there (the prepare script compiles
# src into dist/src), then:
#   1. npm pack: the tarball holds dist/src (JavaScript and types),
#      package.json, the README and the LICENSE (the repository's), and no
#      TypeScript source, test or example;
#   2. installs the tarball into a new project, imports the package with
#      Node, and compiles a TypeScript module against its types;
#   3. installs the package from its directory (npm install <path>) into
#      another new project and imports it.
# Any failure exits non-zero. Needs npm and the registry (or npm's cache).
# Usage: bash scripts/pack-check.sh (from any directory), or npm run
# pack-check.
set -euo pipefail

pkg="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$pkg/../.." && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/seamguard-pack-check.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "pack-check: $*" >&2
  exit 1
}
quiet_npm() { npm --no-audit --no-fund --loglevel=error "$@"; }

# A new project, as a user of the package starts one.
new_project() {
  mkdir -p "$1"
  (cd "$1" && npm init -y >/dev/null)
}

# Imports the package in project $1 and checks a few of its exports.
check_import() {
  (cd "$1" && node -e '
import("@seamguard/client").then((m) => {
  const want = ["SeamguardClient", "Session", "RejectedError", "NoVerdictError", "formatRange", "msgId"];
  const missing = want.filter((k) => typeof m[k] !== "function");
  if (missing.length > 0) throw new Error("missing exports: " + missing.join(", "));
  if (m.formatRange({ start: 0, end: 5 }) !== "[0, 5)") throw new Error("formatRange");
  console.log("imported @seamguard/client: " + Object.keys(m).length + " exports");
});') || fail "importing @seamguard/client in $1 failed"
}

[ -f "$repo/LICENSE" ] || fail "the repository has no LICENSE at $repo/LICENSE"
cmp -s "$pkg/LICENSE" "$repo/LICENSE" || fail "$pkg/LICENSE is not the repository's LICENSE"

echo "--- a clean copy of the package, npm ci (prepare builds dist/src)"
copy="$tmp/repo/clients/typescript"
mkdir -p "$copy"
tar -C "$pkg" --exclude=./node_modules --exclude=./dist -cf - . | tar -C "$copy" -xf -
cp "$repo/LICENSE" "$tmp/repo/LICENSE"
(cd "$copy" && quiet_npm ci) || fail "npm ci in a clean copy failed"
[ -f "$copy/dist/src/index.js" ] && [ -f "$copy/dist/src/index.d.ts" ] ||
  fail "npm ci did not build dist/src/index.js and index.d.ts (the prepare script)"
[ ! -e "$copy/dist/test" ] || fail "prepare compiled the tests too; it should compile src alone"

echo "--- npm pack"
(cd "$copy" && quiet_npm pack --pack-destination "$tmp" >/dev/null) || fail "npm pack failed"
tarballs=("$tmp"/seamguard-client-*.tgz)
[ "${#tarballs[@]}" -eq 1 ] && [ -f "${tarballs[0]}" ] || fail "npm pack wrote no seamguard-client-*.tgz"
tarball="${tarballs[0]}"
tar -tzf "$tarball" | sort >"$tmp/contents"
for f in package/package.json package/LICENSE package/README.md package/dist/src/index.js package/dist/src/index.d.ts; do
  grep -qx "$f" "$tmp/contents" || fail "$f is not in $(basename "$tarball")"
done
if grep -E '^package/(src|test|examples|scripts|dist/test|dist/examples)/' "$tmp/contents"; then
  fail "$(basename "$tarball") holds the sources, tests or examples listed above"
fi
tar -xOzf "$tarball" package/LICENSE | cmp -s - "$repo/LICENSE" || fail "the tarball's LICENSE is not the repository's"
license="$(tar -xOzf "$tarball" package/package.json | node -e 'let s = ""; process.stdin.on("data", (d) => (s += d)).on("end", () => console.log(JSON.parse(s).license))')"
[ "$license" = "Apache-2.0" ] || fail "package.json names the licence \"$license\", not Apache-2.0"
echo "$(basename "$tarball"): $(wc -l <"$tmp/contents") files, licence $license"

echo "--- npm install $(basename "$tarball") into a new project"
new_project "$tmp/from-tarball"
(cd "$tmp/from-tarball" && quiet_npm install "$tarball") || fail "installing the tarball failed"
check_import "$tmp/from-tarball"
cat >"$tmp/from-tarball/consumer.mts" <<'TS'
import { SeamguardClient, formatRange, type SessionOptions, type Verdict } from "@seamguard/client";

const options: SessionOptions = { id: "s-1", span: 4, onRejected: (e) => console.log(e.rejection.code, e.signer) };
export const text: string = formatRange({ start: 0, end: 5 }) + options.id;
export function kind(v: Verdict): "allowed" | "refused" | "halted" {
  return v.kind;
}
export type Client = SeamguardClient;
TS
"$copy/node_modules/.bin/tsc" --noEmit --strict --skipLibCheck --target es2022 --module nodenext --moduleResolution nodenext \
  "$tmp/from-tarball/consumer.mts" || fail "a TypeScript module does not compile against the package's types"
echo "a TypeScript module compiles against its types"

echo "--- npm install <path of the package> into a new project"
new_project "$tmp/from-path"
(cd "$tmp/from-path" && quiet_npm install "$copy") || fail "installing from the package's directory failed"
check_import "$tmp/from-path"

echo "pack-check: ok"
