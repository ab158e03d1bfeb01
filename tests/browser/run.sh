#!/usr/bin/env bash
# The operator console's test in a real browser (test_console.py): headless Chromium driven by
# Selenium through chromedriver, both Debian's (/usr/bin/chromium, /usr/bin/chromedriver; .ci/run
# installs chromium and chromium-driver), against the real server binary, with grpcurl as the
# gRPC client. It writes a screenshot of each page to docs/images/ (or $CONSOLE_SCREENSHOTS).
#
# Creates (or reuses) the venv .venv beside this file with the pinned requirements.txt, finds the
# server in $LEDGER_BIN or ../../target/debug/idempotency-ledger (building it when missing), and
# runs pytest. Extra arguments go to pytest. Works from any directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="$here/.venv"

for tool in /usr/bin/chromium /usr/bin/chromedriver; do
  [ -x "$tool" ] || { echo "$tool is missing: apt-get install chromium chromium-driver" >&2; exit 1; }
done

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
inputs="$(sha256sum "$here/requirements.txt")"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$inputs" ]; then
  echo "== installing $here/requirements.txt into $venv"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
  echo "$inputs" > "$venv/.installed"
fi

bin="${LEDGER_BIN:-$repo/target/debug/idempotency-ledger}"
if [ ! -x "$bin" ]; then
  echo "== building the server (cargo build)"
  (cd "$repo" && cargo build --quiet --bin idempotency-ledger)
fi
export LEDGER_BIN="$bin"
export PATH="$venv/bin:$PATH"  # grpcurl
# Selenium never looks for a driver or a browser to download: both paths are given.
export SE_OFFLINE=true

cd "$here"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$here" "$here/test_console.py" "$@"
