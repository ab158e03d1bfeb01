#!/bin/sh
# The comparison's driver is Rust (bench/src/compare/, bench/README.md); this runs it, e.g.
# `bench/compare.sh --smoke` as scripts/test does. `bench/compare.sh --help` lists the options.
cd "$(dirname "$0")/.." && exec cargo run --locked --release --quiet -p ledger-bench --bin compare -- "$@"
