"""MCP approvals (the real FastMCP and its in-memory client) against the real server with an
approval policy: MCP has no approval step, so a call the ledger holds for a person reads the
awaiting note, a declined one the denial; the call acts once, and only after a Decide."""

from __future__ import annotations

import asyncio
import json

from conftest import AGENT_TOKEN, APPROVER_TOKEN
from fastmcp import Client, FastMCP

from idempotency_ledger import AsyncLedger, Status, current_attempt
from idempotency_ledger.mcp import RUN_ID_META_KEY, LedgerMiddleware
from idempotency_ledger.testing import LedgerServer


def refunds_server(ledger: AsyncLedger, refunds: list[dict]) -> FastMCP:
    # What a user writes: the middleware; the ledger's policy gates the tool.
    mcp = FastMCP("refunds", middleware=[LedgerMiddleware(ledger)])

    @mcp.tool
    def issue_refund(order: str, amount: int) -> str:
        """Refund an order."""
        refunds.append({"order": order, "ref": current_attempt().external_ref})
        return f"refunded {order}"

    return mcp


def test_awaiting_then_approved_acts_once_and_denied_reads_the_reason(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            async with Client(refunds_server(ledger, refunds)) as client:
                meta = {RUN_ID_META_KEY: run_id}
                args = {"order": "o-3", "amount": 400}
                waiting = await client.call_tool_mcp("issue_refund", args, meta=meta)
                read = json.loads(waiting.content[0].text)
                assert read["status"] == "awaiting_approval" and "person" in read["note"]
                assert refunds == []
                entry = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=args)
                await approver.decide(entry.key, entry.fingerprint, "approve", "ok")
                done = await asyncio.gather(*(client.call_tool_mcp("issue_refund", args,
                                                                   meta=meta)
                                              for _ in range(2)))
                assert len(refunds) == 1
                assert any(r.content[0].text == "refunded o-3" for r in done)
                # Another refund, declined: the client reads the person's reason.
                other = {"order": "o-4", "amount": 900}
                await client.call_tool_mcp("issue_refund", other, meta=meta)
                entry = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=other)
                await approver.decide(entry.key, entry.fingerprint, "deny", "over the limit")
                denied = await client.call_tool_mcp("issue_refund", other, meta=meta)
                read = json.loads(denied.content[0].text)
                assert read["status"] == "denied" and "over the limit" in read["note"]
                assert len(refunds) == 1
                assert (await ledger.lookup(entry.key)).status == Status.DENIED

    asyncio.run(main())
