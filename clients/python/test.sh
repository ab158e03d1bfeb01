#!/usr/bin/env bash
# The Python client's tests, against the real server binary, and the documented grpcurl
# walk-throughs of the README and docs/agents.md (../../tests/readme_walkthrough.py).
#
# Creates (or reuses) the venv .venv beside this file, installs the package with its test extras
# and the framework adapters' extras at the versions of constraints.txt (the build generates the
# gRPC stubs from ../../proto into itself, never into the checkout), finds
# the server in $LEDGER_BIN or ../../target/debug/idempotency-ledger (building it when missing),
# and runs pytest. Extra arguments go to pytest. Works from any directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.venv"

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi

# The test extras and every framework adapter's extra: each adapter is tested against the real
# framework from PyPI, at the versions constraints.txt pins.
extras="test,pydantic-ai,openai-agents,langchain,mcp"

# Reinstall only when what the package is built from changed (its sources, the proto, the pins).
export PIP_CONSTRAINT="$here/constraints.txt" PIP_DISABLE_PIP_VERSION_CHECK=1
inputs="$(cd "$here" && find pyproject.toml hatch_build.py generate.py constraints.txt README.md \
  src/idempotency_ledger "$repo/proto" -type f ! -path '*/__pycache__/*' -print0 \
  | sort -z | xargs -0 sha256sum | sha256sum)"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$inputs" ]; then
  echo "== installing idempotency-ledger[$extras] into $venv"
  "$venv/bin/python" -m pip install --quiet "$here[$extras]"
  echo "$inputs" > "$venv/.installed"
fi

bin="${LEDGER_BIN:-$repo/target/debug/idempotency-ledger}"
if [ ! -x "$bin" ]; then
  echo "== building the server (cargo build)"
  (cd "$repo" && cargo build --quiet --bin idempotency-ledger)
fi
export LEDGER_BIN="$bin"
export PATH="$venv/bin:$PATH"  # grpcurl for the walk-through

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -c "$here/pyproject.toml" \
  --rootdir "$repo" "$here/tests" "$repo/tests/readme_walkthrough.py" "$@"
