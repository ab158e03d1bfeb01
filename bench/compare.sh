#!/bin/sh
# The comparison's driver is Rust (bench/src/compare/, bench/README.md); this runs it, e.g.
# `bench/compare.sh --smoke` as scripts/test does. `bench/compare.sh --help` lists the options.
# In --smoke mode (CI) the driver and every binary it runs are built with the `smoke` profile
# (no fat LTO: see Cargo.toml), else with `release`.
profile=release
for arg in "$@"; do
  [ "$arg" = "--smoke" ] && profile=smoke
done
cd "$(dirname "$0")/.." && exec cargo run --locked --profile "$profile" --quiet -p ledger-bench --bin compare -- "$@"
