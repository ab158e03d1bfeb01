#!/usr/bin/env python3
"""The reconciler of the example tools: settles the calls whose outcome nobody knows (a timeout,
a lease that ended without a Complete) with each tool's paired read, through the client's own
``Reconciler``: found means ``SUCCEEDED`` with the result the tool would have returned, so the
next call of that intent replays it; not found means ``FAILED``, retryable, so the next call
runs it; cannot tell leaves it for the next round.

The paired reads are all this file writes; the loop (Reconcile by tool, pacing, backoff, the
settlement log, stopping on a signal) is the client's:

    python reconciler.py --target 127.0.0.1:50051 --world world.json --older-than 30

runs one round and prints one JSON line per entry it settled (``--forever`` keeps going until
SIGINT or SIGTERM). The same tools under the console entry point, from this directory::

    EXAMPLE_WORLD=world.json idempotency-ledger-reconciler reconciler:tools --older-than 30
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any

from reads import paired_reads
from world import World

from idempotency_ledger import Ledger, Reconciler


def tools() -> dict[str, Any]:
    """For the console entry point: the paired reads of the world named by $EXAMPLE_WORLD."""
    return paired_reads(World(os.environ["EXAMPLE_WORLD"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's host:port")
    parser.add_argument("--token", help="bearer token of the tenant, if the ledger needs one")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--older-than", type=float, default=30.0,
                        help="only entries started at least this many seconds ago")
    parser.add_argument("--forever", action="store_true", help="keep reconciling until stopped")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)  # the settlement log
    with Ledger(ns.target, token=ns.token) as ledger:
        reconciler = Reconciler(ledger, paired_reads(World(ns.world)), older_than=ns.older_than)
        if ns.forever:
            reconciler.run()
        else:
            reconciler.run_round()
        for settlement in reconciler.settlements:
            print(json.dumps({**dataclasses.asdict(settlement),
                              "status": settlement.status.name}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
