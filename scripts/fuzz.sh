#!/usr/bin/env bash
# Runs every fuzz target of seamguard for a set time each (default 10m):
#   scripts/fuzz.sh            # 10 minutes per target
#   FUZZTIME=30s scripts/fuzz.sh
# `go test ./...` (and so CI) runs only the seed corpora. A crasher found
# here is written under the package's testdata/fuzz/ and then fails plain
# `go test` until it is fixed: commit it with the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${FUZZTIME:-10m}
run() {
	local pkg=$1 target=$2
	echo "--- $pkg $target for $time"
	go test "$pkg" -run '^$' -fuzz "^${target}\$" -fuzztime "$time" -parallel "${FUZZPARALLEL:-2}"
}
run ./events FuzzDecodeJSON
run ./events FuzzDecodeMsg
run ./events FuzzDecodeFastSlow
run ./events FuzzMarshalStructured
run ./events FuzzValidJSON
run ./events FuzzFastJSON
run ./processor/ledger FuzzStep
run ./processor/ledger FuzzSnapshot
