#!/usr/bin/env python3
"""A reconciler worker: resolves the tool calls whose outcome nobody knows (a timeout, a lease
that ended without a Complete) by asking each tool's paired read whether the effect exists.

The loop: ``Reconcile`` hands out unresolved entries (held for this worker for a while); for each,
the tool's own read looks the effect up by the entry's ``external_ref``; the answers go back as
resolutions with the next ``Reconcile`` call: found means ``SUCCEEDED`` with the result the tool
would have returned, so the next call of that intent replays it; not found means ``FAILED``,
retryable, so the next call runs it.

    python reconciler.py --target 127.0.0.1:50051 --world world.json --older-than 30

prints one JSON line per entry it resolved.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from dispatcher import credit_result, reply_result
from world import World

from idempotency_ledger import JSON, Entry, Ledger, Resolution

# For each tool: its paired read by reference, and how a found record becomes the tool's result.
Reader = Callable[[World, str], "dict[str, Any] | None"]
READS: dict[str, tuple[Reader, Callable[[dict[str, Any]], Any]]] = {
    "issue_credit": (World.find_credit, credit_result),
    "send_reply": (World.find_reply, reply_result),
}


def resolve(world: World, entry: Entry) -> Resolution:
    """What the outside world says about one unresolved entry."""
    read, result_of = READS[entry.tool]
    record = read(world, entry.external_ref)
    if record is None:
        return Resolution.not_found(
            entry.key, f"no {entry.tool} effect with reference {entry.external_ref}",
            retryable=True)
    return Resolution.found(entry.key, JSON.encode(result_of(record)))


def reconcile(ledger: Ledger, world: World, *, older_than: float = 30.0, tool: str = "",
              limit: int = 100, max_rounds: int = 20) -> list[Entry]:
    """Runs the loop until nothing this worker can answer is pending; returns the entries it
    resolved, as they stand afterwards. Entries of tools it has no read for are left alone."""
    resolved: list[Entry] = []
    resolutions: list[Resolution] = []
    for _ in range(max_rounds):
        batch = ledger.reconcile(older_than=older_than, tool=tool, limit=limit,
                                 resolutions=resolutions)
        resolved += batch.resolved
        resolutions = [resolve(world, e) for e in batch.pending if e.tool in READS]
        if not resolutions:
            break
    return resolved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's host:port")
    parser.add_argument("--token", help="bearer token of the tenant, if the ledger needs one")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--older-than", type=float, default=30.0,
                        help="only entries started at least this many seconds ago")
    parser.add_argument("--tool", default="", help="only this tool's entries")
    ns = parser.parse_args(argv)
    with Ledger(ns.target, token=ns.token) as ledger:
        for entry in reconcile(ledger, World(ns.world), older_than=ns.older_than, tool=ns.tool):
            print(json.dumps({"key": entry.key, "tool": entry.tool, "status": entry.status.name,
                              "result": JSON.decode(entry.result), "error": entry.error,
                              "retryable": entry.retryable}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
