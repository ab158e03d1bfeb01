"""MCP (the real FastMCP and its in-memory client): LedgerMiddleware makes a server's tools run
once per run id sent in the request's _meta; against the real ledger server."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.exceptions import ToolError
from pydantic import BaseModel
from scenario import CREDIT, NOT_PERFORMED_VIEW, REPLAY_NOTE, UNKNOWN_VIEW, Payments

from idempotency_ledger import AsyncLedger, Ledger, NotExecuted, Status, current_attempt
from idempotency_ledger.mcp import REPLAYED_META_KEY, RUN_ID_META_KEY, LedgerMiddleware
from idempotency_ledger.testing import LedgerServer

CREDIT_RESPELLED = json.loads('{"currency": "EUR", "amount": 2e2, "customer": "c-42"}')


class Credit(BaseModel):
    credit_id: str
    amount: int
    currency: str


def payments_server(ledger: Ledger | AsyncLedger, payments: Payments, **options: Any) -> FastMCP:
    mcp = FastMCP("payments", middleware=[LedgerMiddleware(ledger, **options)])
    looked_up: list[str] = []

    @mcp.tool
    async def issue_credit(customer: str, amount: int, currency: str) -> Credit:
        """Issue a credit to a customer."""
        await asyncio.sleep(0)
        return Credit(**payments.issue_credit(customer, amount, currency,
                                              current_attempt().external_ref))

    @mcp.tool
    def send_reply(ticket: str, text: str) -> str:
        """Reply to a ticket."""
        payments.refuse_once()  # a 429 the first time: NotExecuted
        return f"sent on attempt {current_attempt().number}"

    @mcp.tool(annotations={"readOnlyHint": True})
    def find_credit(reference: str) -> list[str]:
        """Look a credit up (read-only: not claimed)."""
        looked_up.append(reference)
        return [c["credit_id"] for c in payments.credits if c["reference"] == reference]

    mcp.looked_up = looked_up  # type: ignore[attr-defined]
    return mcp


def meta(run_id: str) -> dict[str, str]:
    return {RUN_ID_META_KEY: run_id}


def test_every_tool_of_the_server_runs_once_per_run(server: LedgerServer, run_id: str) -> None:
    payments = Payments()

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            mcp = payments_server(ledger, payments)
            async with Client(mcp) as client:
                first = await asyncio.gather(*(client.call_tool_mcp(
                    "issue_credit", CREDIT, meta=meta(run_id)) for _ in range(2)))
                third = await client.call_tool_mcp("issue_credit", CREDIT_RESPELLED,
                                                   meta=meta(run_id))
                results = [*first, third]
                assert len(payments.credits) == 1 and not any(r.is_error for r in results)
                fresh = [r for r in results if REPLAY_NOTE not in r.content[0].text]
                replays = [r for r in results if REPLAY_NOTE in r.content[0].text]
                assert (len(fresh), len(replays)) == (1, 2)
                (original,) = fresh
                for replay in replays:  # the stored result, after the note
                    assert replay.structured_content == original.structured_content
                    assert replay.content[1:] == original.content
                    assert replay.meta[REPLAYED_META_KEY] is True
                    assert json.loads(replay.content[0].text)["status"] == "already_done"
                # The typed client still reads the structured result of a replay.
                typed = await client.call_tool("issue_credit", CREDIT, meta=meta(run_id))
                assert typed.data.credit_id == "cr-001"
                # Another run acts again.
                await client.call_tool("issue_credit", CREDIT, meta=meta(f"{run_id}-2"))
                assert len(payments.credits) == 2
                # A read-only tool is left alone: no run id needed, nothing claimed.
                found = await client.call_tool("find_credit",
                                               {"reference": payments.credits[0]["reference"]})
                assert found.data == ["cr-001"]
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            assert entry.replay_count == 3

    asyncio.run(main())


def test_a_call_without_a_run_id_is_a_clear_tool_error(server: LedgerServer) -> None:
    payments = Payments()

    async def main() -> None:
        with Ledger(server.address) as ledger:
            async with Client(payments_server(ledger, payments)) as client:
                with pytest.raises(ToolError, match=RUN_ID_META_KEY):
                    await client.call_tool("issue_credit", CREDIT)
                result = await client.call_tool_mcp("issue_credit", CREDIT)
                assert result.is_error and "Nothing was done" in result.content[0].text
        assert payments.credits == []

    asyncio.run(main())


def test_a_tool_that_refuses_before_acting_is_retryable(server: LedgerServer,
                                                        run_id: str) -> None:
    payments = Payments(delay=0)
    args = {"ticket": "t-1", "text": "hi"}

    async def main() -> None:
        with Ledger(server.address) as ledger:  # the blocking client works in a server too
            async with Client(payments_server(ledger, payments, tools={"send_reply"})) as client:
                refused = await client.call_tool_mcp("send_reply", args, meta=meta(run_id))
                assert refused.is_error and "429" in refused.content[0].text
                entry = ledger.lookup(run_id=run_id, tool="send_reply", arguments=args)
                assert (entry.status, entry.retryable) == (Status.FAILED, True)
                sent = await client.call_tool("send_reply", args, meta=meta(run_id))
                assert sent.data == "sent on attempt 2"
                again = await client.call_tool_mcp("send_reply", args, meta=meta(run_id))
                assert REPLAY_NOTE in again.content[0].text
                assert again.content[1].text == "sent on attempt 2"

    asyncio.run(main())


def test_outcomes_that_are_not_a_result_are_notes(server: LedgerServer, run_id: str) -> None:
    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            mcp = FastMCP("tools", middleware=[LedgerMiddleware(ledger, wait=0)])
            release = asyncio.Event()

            @mcp.tool
            async def slow(n: int) -> str:
                await release.wait()
                return "done"

            @mcp.tool
            def gone(n: int) -> str:
                raise NotExecuted("x") if n < 0 else __import__(
                    "idempotency_ledger").PermanentFailure("no such customer")

            async with Client(mcp) as client:
                first = asyncio.create_task(client.call_tool("slow", {"n": 1},
                                                             meta=meta(run_id)))
                for _ in range(500):
                    entries = [e async for e in ledger.list_entries(run_id=run_id)]
                    if entries:
                        break
                    await asyncio.sleep(0.01)
                in_progress = await client.call_tool_mcp("slow", {"n": 1}, meta=meta(run_id))
                # slow() has an output schema (its return annotation): a note is an error result.
                assert in_progress.is_error
                assert json.loads(in_progress.content[0].text)["status"] == "in_progress"
                release.set()
                assert (await first).data == "done"
                assert (await client.call_tool_mcp("gone", {"n": 1}, meta=meta(run_id))).is_error
                failed = await client.call_tool_mcp("gone", {"n": 1}, meta=meta(run_id))
                assert failed.is_error
                view = json.loads(failed.content[0].text)
                assert view["status"] == "previously_failed" and "no such customer" in view["note"]

    asyncio.run(main())


def test_a_context_tool_may_use_the_decorator(server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            mcp = FastMCP("payments")

            @mcp.tool
            @ledger.tool()
            async def issue_credit(customer: str, amount: int, currency: str,
                                   ctx: Context) -> dict:
                """Issue a credit."""
                return payments.issue_credit(customer, amount, currency,
                                             current_attempt().external_ref)

            async with Client(mcp) as client:
                (listed,) = await client.list_tools()
                assert set(listed.input_schema["properties"]) == {"customer", "amount",
                                                                  "currency"}
                await client.call_tool("issue_credit", CREDIT, meta=meta(run_id))
                again = await client.call_tool("issue_credit", CREDIT, meta=meta(run_id))
                assert again.data["status"] == "already_done"
                assert len(payments.credits) == 1

    asyncio.run(main())


# --- unknown outcomes, confirm, strict mode, the run id -----------------------------------------


def flaky_server(ledger: Ledger | AsyncLedger, payments: Payments, *, act_first: bool = True,
                 **options: Any) -> tuple[FastMCP, list[int]]:
    """A server whose tool reports the payments API's timeout with FastMCP's ToolError, after
    the credit went through (or before it was sent); the next call works."""
    mcp = FastMCP("payments", middleware=[LedgerMiddleware(ledger, **options)])
    calls: list[int] = []

    @mcp.tool
    def issue_credit(customer: str, amount: int, currency: str):  # noqa: ANN201 (untyped: text)
        """Issue a credit to a customer."""
        calls.append(current_attempt().number)
        if len(calls) == 1:
            if act_first:
                payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
            raise ToolError("the payments API timed out, try again")
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    return mcp, calls


def test_a_tool_error_after_acting_is_unknown_and_the_client_reads_the_note(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            mcp, _ = flaky_server(ledger, payments)
            async with Client(mcp) as client:
                results = [await client.call_tool_mcp("issue_credit", CREDIT, meta=meta(run_id))
                           for _ in range(2)]
        for result in results:  # a normal result, on the call and on the repeat
            assert not result.is_error
            assert json.loads(result.content[0].text) == UNKNOWN_VIEW

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_with_confirm_the_client_reads_the_result_found(server: LedgerServer,
                                                        run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            mcp, _ = flaky_server(ledger, payments, confirm={"issue_credit": payments.confirm},
                                  confirm_delay=0)
            async with Client(mcp) as client:
                first = await client.call_tool_mcp("issue_credit", CREDIT, meta=meta(run_id))
                again = await client.call_tool_mcp("issue_credit", CREDIT, meta=meta(run_id))
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            assert entry.status == Status.SUCCEEDED and entry.resolved_by
        expected = {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}
        assert not first.is_error and json.loads(first.content[0].text) == expected
        assert first.structured_content == expected
        assert again.meta[REPLAYED_META_KEY] is True

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_a_timeout_before_acting_with_confirm_is_not_found_and_the_next_call_acts_once(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> None:
        with Ledger(server.address) as ledger:
            mcp, calls = flaky_server(ledger, payments, act_first=False,
                                      confirm={"issue_credit": payments.confirm},
                                      confirm_delay=0)
            async with Client(mcp) as client:
                first = await client.call_tool_mcp("issue_credit", CREDIT, meta=meta(run_id))
                second = await client.call_tool_mcp("issue_credit", CREDIT, meta=meta(run_id))
        assert json.loads(first.content[0].text) == NOT_PERFORMED_VIEW
        assert second.structured_content["credit_id"] == "cr-001"
        assert calls == [1, 2]

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_strict_mode_refuses_a_tool_without_confirm(server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> None:
        with Ledger(server.address, require_confirm=True) as ledger:
            with pytest.raises(ValueError, match="issue_credit has no confirm="):
                LedgerMiddleware(ledger, tools=["issue_credit"])
            async with Client(payments_server(ledger, payments)) as client:
                with pytest.raises(ToolError, match="issue_credit has no confirm="):
                    await client.call_tool("issue_credit", CREDIT, meta=meta(run_id))

    asyncio.run(main())
    assert payments.credits == []


def test_the_server_may_name_the_run_and_a_missing_one_is_logged(
        server: LedgerServer, run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    payments = Payments(delay=0)
    asked: list[Any] = []

    def session_run(context: Any) -> str | None:
        asked.append(context.message.name)
        return run_id if context.message.arguments.get("customer") != "c-0" else None

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            mcp = payments_server(ledger, payments, run_id=session_run)
            async with Client(mcp) as client:  # a host that sends no _meta at all
                await client.call_tool("issue_credit", CREDIT)
                again = await client.call_tool("issue_credit", CREDIT)
                assert again.data.credit_id == "cr-001"
                for _ in range(2):
                    with pytest.raises(ToolError, match="found none"):
                        await client.call_tool("issue_credit", {**CREDIT, "customer": "c-0"})

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert len(payments.credits) == 1 and asked.count("issue_credit") == 4
    assert (await_lookup := Ledger(server.address)).lookup(
        run_id=run_id, tool="issue_credit", arguments=CREDIT).replay_count == 1
    await_lookup.close()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR
              and r.name == "idempotency_ledger"]
    assert len(errors) == 1 and "issue_credit" in errors[0].getMessage()
