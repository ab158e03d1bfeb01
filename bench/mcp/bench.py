"""The MCP gateway's benchmark: the same upstream called directly and through
``idempotency-ledger mcp``, in one run, over stdio and Streamable HTTP, at 1 and 32 calls
in flight in one client, and over HTTP at 32 clients each in a session of its own, with the official Python SDK's client on both sides (so its own cost is in both
figures and cancels out of the difference). Every call is a new intent (it acts), but the replay
row, which repeats one call. Prints a table and writes ``bench/results/mcp.json``.

    python bench/mcp/bench.py [--calls N] [--binary PATH]

Figures: calls per second; p50 and p99 latency per ``tools/call``, and what the gateway adds to
each (gateway minus direct); the gateway's CPU per call (user + system time of its process
over the run, from /proc) and its resident memory before and after (flat means no growth per
call). The ledger is the embedded SQLite store in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
UPSTREAM = HERE / "upstream.py"
CLK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def gateway_pid(parent: int | None = None) -> int | None:
    """The pid of the running gateway (the newest `idempotency-ledger mcp` process)."""
    out = subprocess.run(["pgrep", "-n", "-f", "idempotency-ledger mcp"], capture_output=True,
                         text=True).stdout.strip()
    return int(out) if out else None


async def run_calls(client: Client, calls: int, inflight: int, offset: int,
                    replay: bool) -> list[float]:
    latencies: list[float] = []
    next_n = offset

    async def worker() -> None:
        nonlocal next_n
        while True:
            n = next_n
            if n >= offset + calls:
                return
            next_n += 1
            start = time.perf_counter()
            result = await client.call_tool("act", {"n": 0 if replay else n})
            latencies.append(time.perf_counter() - start)
            if result.is_error:
                raise RuntimeError(f"call {n} failed: {result}")

    async with anyio.create_task_group() as tg:
        for _ in range(inflight):
            tg.start_soon(worker)
    return latencies


def summary(latencies: list[float], seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "calls_per_second": len(ordered) / seconds,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[int(len(ordered) * 0.99) - 1] * 1000,
    }


async def measure(target: Any, calls: int, inflight: int, replay: bool = False,
                  watch: bool = False) -> dict[str, float]:
    async with Client(target, mode="2026-07-28") as client:
        await run_calls(client, 20, min(inflight, 4), 10_000_000, replay)  # warm up
        pid = gateway_pid() if watch else None
        cpu0, rss0 = (cpu_seconds(pid), rss_mib(pid)) if pid else (0.0, 0.0)
        start = time.perf_counter()
        latencies = await run_calls(client, calls, inflight, 0 if replay else inflight * 10**6,
                                    replay)
        seconds = time.perf_counter() - start
        row = summary(latencies, seconds)
        if pid:
            row["gateway_cpu_ms_per_call"] = (cpu_seconds(pid) - cpu0) / calls * 1000
            row["gateway_rss_mib_before"] = rss0
            row["gateway_rss_mib_after"] = rss_mib(pid)
        return row


async def measure_sessions(target: Any, calls: int, sessions: int,
                           watch: bool = False) -> dict[str, float]:
    """`sessions` clients of the session-based revision (each its own session, one call in
    flight), `calls` calls in all."""
    clients = [Client(target, mode="legacy") for _ in range(sessions)]
    for client in clients:
        await client.__aenter__()
    try:
        for i, client in enumerate(clients):  # warm up
            await run_calls(client, 2, 1, 20_000_000 + i * 10, False)
        pid = gateway_pid() if watch else None
        cpu0, rss0 = (cpu_seconds(pid), rss_mib(pid)) if pid else (0.0, 0.0)
        latencies: list[float] = []
        share = calls // sessions

        async def one(i: int, client: Client) -> None:
            latencies.extend(await run_calls(client, share, 1, 30_000_000 + i * 10**5, False))

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, client in enumerate(clients):
                tg.start_soon(one, i, client)
        seconds = time.perf_counter() - start
        row = summary(latencies, seconds)
        if pid:
            row["gateway_cpu_ms_per_call"] = (cpu_seconds(pid) - cpu0) / len(latencies) * 1000
            row["gateway_rss_mib_before"] = rss0
            row["gateway_rss_mib_after"] = rss_mib(pid)
        return row
    finally:
        for client in reversed(clients):
            await client.__aexit__(None, None, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--binary", default=str(REPO / "target" / "release" / "idempotency-ledger"))
    args = parser.parse_args()
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite://{tmp}/ledger.db"
        direct = StdioServerParameters(command=sys.executable, args=[str(UPSTREAM)])
        gated = StdioServerParameters(command=args.binary, args=[
            "mcp", "--database-url", store, "--", sys.executable, str(UPSTREAM)],
            env={**os.environ, "RUST_LOG": "warn"})
        port, gport = free_port(), free_port()
        upstream = subprocess.Popen([sys.executable, str(UPSTREAM), "--http", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        gateway = subprocess.Popen([args.binary, "mcp", "--database-url", f"sqlite://{tmp}/h.db",
                                    "--listen", f"127.0.0.1:{gport}", "--upstream",
                                    f"http://127.0.0.1:{port}/mcp"],
                                   env={**os.environ, "RUST_LOG": "warn"})
        try:
            wait_port(port)
            wait_port(gport)
            for transport, plain, through in [
                ("stdio", direct, gated),
                ("http", f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{gport}/mcp"),
            ]:
                for inflight in (1, 32):
                    rows[f"{transport} direct, {inflight} in flight"] = anyio.run(
                        measure, plain, args.calls, inflight)
                    rows[f"{transport} gateway, {inflight} in flight"] = anyio.run(
                        measure, through, args.calls, inflight, False, True)
                rows[f"{transport} gateway replay, 1 in flight"] = anyio.run(
                    measure, through, args.calls, 1, True, True)
            http = (f"http://127.0.0.1:{port}/mcp", f"http://127.0.0.1:{gport}/mcp")
            rows["http direct, 32 sessions"] = anyio.run(measure_sessions, http[0], args.calls, 32)
            rows["http gateway, 32 sessions"] = anyio.run(
                measure_sessions, http[1], args.calls, 32, True)
        finally:
            gateway.terminate()
            upstream.terminate()
    width = max(len(k) for k in rows)
    print(f"{'':{width}}  calls/s   p50 ms   p99 ms   cpu ms/call  rss MiB before -> after")
    for name, row in rows.items():
        extra = ""
        if "gateway_cpu_ms_per_call" in row:
            extra = (f"   {row['gateway_cpu_ms_per_call']:9.3f}   "
                     f"{row['gateway_rss_mib_before']:6.1f} -> {row['gateway_rss_mib_after']:6.1f}")
        print(f"{name:{width}}  {row['calls_per_second']:7.1f}  {row['p50_ms']:7.2f}  "
              f"{row['p99_ms']:7.2f}{extra}")
    pairs = [(f"{t}, {n} in flight", f"{t} direct, {n} in flight", f"{t} gateway, {n} in flight")
             for t in ("stdio", "http") for n in (1, 32)]
    pairs.append(("http, 32 sessions", "http direct, 32 sessions", "http gateway, 32 sessions"))
    for label, direct_row, gateway_row in pairs:
        d, g = rows[direct_row], rows[gateway_row]
        print(f"{label}: the gateway adds "
              f"{g['p50_ms'] - d['p50_ms']:.2f} ms at the p50, "
              f"{g['p99_ms'] - d['p99_ms']:.2f} ms at the p99")
    out = REPO / "bench" / "results" / "mcp.json"
    out.write_text(json.dumps({"calls": args.calls, "rows": rows}, indent=2) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
