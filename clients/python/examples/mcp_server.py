#!/usr/bin/env python3
"""An MCP server (FastMCP) whose write tools happen once per agent run, by configuration: one
middleware, and the MCP client sends its run's id in each call's ``_meta``.

Offline, no model key needed: the agent is played by FastMCP's in-memory client, calling
``issue_credit`` twice at once, then again with the arguments reordered and the amount spelled
``2e2``, then ``send_reply``, as a model's runtime would. The world is the examples' fake
payments API and mailbox (world.py); ``find_credit`` is read-only and left alone.

    python mcp_server.py --target 127.0.0.1:50051 --world world.json --run-id run-7f3a

prints what the client read from each tool call, one JSON line each. ``build_server`` is the
server as you would deploy it (``build_server(...).run()`` serves it over stdio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from fastmcp import Client, FastMCP
from reads import paired_reads
from world import World

from idempotency_ledger import AsyncLedger, Ledger, current_attempt
from idempotency_ledger.mcp import RUN_ID_META_KEY, LedgerMiddleware


def build_server(ledger: Ledger | AsyncLedger, world: World) -> FastMCP:
    """The payments MCP server; the middleware makes every tool not marked read-only run once."""
    # Each write tool with its paired read, which settles an unknown outcome.
    mcp = FastMCP("payments", middleware=[LedgerMiddleware(ledger, confirm=paired_reads(world))])

    @mcp.tool
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer's account."""
        credit = world.issue_credit(customer, amount, currency,
                                    reference=current_attempt().external_ref)
        return {"credit_id": credit["credit_id"], "amount": amount, "currency": currency}

    @mcp.tool
    def send_reply(ticket: str, text: str) -> dict:
        """Reply to the customer on a support ticket."""
        reply = world.send_reply(ticket, text, reference=current_attempt().external_ref)
        return {"message_id": reply["message_id"]}

    @mcp.tool(annotations={"readOnlyHint": True})
    def find_credit(reference: str) -> dict:
        """The credit issued with this reference, if any (a read-only tool: not claimed)."""
        return {"credit": world.find_credit(reference)}

    return mcp


async def play_agent(ledger: AsyncLedger, world: World, run_id: str) -> list[dict]:
    """The agent's side: its tool calls, each with the run's id in _meta."""
    meta = {RUN_ID_META_KEY: run_id}
    credit = {"customer": "c-42", "amount": 200, "currency": "EUR"}
    respelled = json.loads('{"currency": "EUR", "amount": 2e2, "customer": "c-42"}')
    async with Client(build_server(ledger, world)) as client:
        calls = list(await asyncio.gather(
            *(client.call_tool_mcp("issue_credit", credit, meta=meta) for _ in range(2))))
        calls.append(await client.call_tool_mcp("issue_credit", respelled, meta=meta))
        calls.append(await client.call_tool_mcp(
            "send_reply", {"ticket": "t-9", "text": "Your credit of 200 EUR is on its way."},
            meta=meta))
    names = ["issue_credit"] * 3 + ["send_reply"]
    return [{"tool": name, "read": [block.text for block in result.content]}
            for name, result in zip(names, calls, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's address")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--run-id", required=True, help="the agent run, sent in _meta")
    ns = parser.parse_args(argv)

    async def run() -> list[dict]:
        async with AsyncLedger(ns.target) as ledger:
            return await play_agent(ledger, World(ns.world), ns.run_id)

    for line in asyncio.run(run()):
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
