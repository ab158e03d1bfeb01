#!/usr/bin/env bash
# The TypeScript client's tests: installs the pinned dependencies (npm ci), generates the stubs
# from proto/ (buf generate, no protoc), compiles with tsc, and runs the suite with node's test
# runner against the real server binary, which the tests start themselves (a free port, a temp
# SQLite file). Works from a clean clone and from any directory.
#
#   clients/typescript/test.sh                 # the server from ../../target/debug (built if missing)
#   LEDGER_BIN=/path/to/idempotency-ledger clients/typescript/test.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"

echo "== npm ci"
npm ci --no-audit --no-fund

echo "== buf generate (stubs from proto/ into src/gen/)"
node_modules/.bin/buf generate

echo "== tsc"
rm -rf dist
node_modules/.bin/tsc -p .

if [ -n "${LEDGER_BIN:-}" ]; then
  bin="$LEDGER_BIN"
else
  bin="$repo/target/debug/idempotency-ledger"
  if [ ! -x "$bin" ]; then
    echo "== cargo build (no server binary at $bin)"
    (cd "$repo" && cargo build --bin idempotency-ledger)
  fi
fi
if [ ! -x "$bin" ]; then
  echo "server binary $bin is missing or not executable" >&2
  exit 1
fi
export LEDGER_BIN="$bin"
echo "== node --test (server: $LEDGER_BIN)"
# Three files at a time: they mostly wait on their own server and on timers, and node's default
# (one fewer than the cores) runs them one by one on a 2-core machine.
node --test --test-concurrency=3 dist/test/*.test.js
