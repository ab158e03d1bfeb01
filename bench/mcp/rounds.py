"""Where the gateway's added latency goes, measured in interleaved rounds so that the machine's
drift from minute to minute falls on every variant alike: the upstream called directly, through
the gateway with every call governed (a new intent each: the ledger's window, claim and
completion), and through the gateway with the tool passed (`act pass`: the proxying alone).

    python bench/mcp/rounds.py [--rounds N] [--calls N] [--binary PATH]

Prints each variant's p50 per round, the median of those, and what it adds to the direct one.
One call in flight over stdio, the ledger on the embedded SQLite store in a temporary directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "upstream.py"
REPO = HERE.parents[1]


async def p50_ms(params: StdioServerParameters, calls: int, base: int) -> float:
    latencies: list[float] = []
    async with Client(params, mode="2026-07-28") as client:
        for i in range(30):  # warm up
            await client.call_tool("act", {"n": base + 10**8 + i})
        for i in range(calls):
            start = time.perf_counter()
            await client.call_tool("act", {"n": base + i})
            latencies.append(time.perf_counter() - start)
    return statistics.median(latencies) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--binary", default=str(REPO / "target" / "release" / "idempotency-ledger"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="mcp-rounds-"))
    (tmp / "pass.policy").write_text("act pass\n")
    env = {**os.environ, "RUST_LOG": "error"}
    upstream = [sys.executable, str(UPSTREAM)]
    variants = {
        "direct": StdioServerParameters(command=upstream[0], args=upstream[1:]),
        "governed": StdioServerParameters(command=args.binary, env=env, args=[
            "mcp", "--database-url", f"sqlite://{tmp}/governed.db", "--", *upstream]),
        "passed": StdioServerParameters(command=args.binary, env=env, args=[
            "mcp", "--database-url", f"sqlite://{tmp}/passed.db",
            "--mcp-policy", str(tmp / "pass.policy"), "--", *upstream]),
    }
    rounds: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, params in variants.items():
            rounds[name].append(anyio.run(p50_ms, params, args.calls, r * 10**6))
    direct = statistics.median(rounds["direct"])
    for name, p50s in rounds.items():
        median = statistics.median(p50s)
        print(f"{name:9} p50 ms per round: {' '.join(f'{x:.2f}' for x in p50s)}; "
              f"median {median:.2f}, adds {median - direct:.2f}")


if __name__ == "__main__":
    main()
