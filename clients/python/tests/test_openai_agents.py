"""OpenAI Agents SDK (the real package, its offline ScriptedModel, an implementation of its Model
interface): ToolContext tools made run-once with @ledger.tool(), against the real server."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_trace_processors
from agents.exceptions import ToolTimeoutError
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from scenario import (
    CREDIT,
    CREDIT_RESPELLED,
    NOT_PERFORMED_VIEW,
    UNKNOWN_VIEW,
    Payments,
    count_notes,
)

import idempotency_ledger.openai_agents  # noqa: F401 (teaches ledger.tool() the SDK's context)
from idempotency_ledger import AsyncLedger, Ledger, NoRunId, Status, current_attempt
from idempotency_ledger.testing import LedgerServer


@pytest.fixture(autouse=True, scope="module")
def _no_trace_export() -> None:
    # Traces are still made (their ids are run ids), but not sent anywhere.
    set_trace_processors([])


@dataclass
class Session:
    """The context passed to Runner.run: it names the run."""

    run_id: str


def scripted(tool: str = "issue_credit", args: Any = None, parallel: bool = True) -> ScriptedModel:
    args = CREDIT if args is None else args
    first = [function_call(tool, args, call_id=f"call-{n}") for n in range(1, 3 if parallel else 2)]
    again = CREDIT_RESPELLED if args is CREDIT else args
    return ScriptedModel([first, [function_call(tool, again, call_id="call-3")],
                          [assistant_message("done")]])


def outputs(result: Any) -> list[str]:
    return [item["output"] for item in result.to_input_list()
            if item.get("type") == "function_call_output"]


def credit_tool(ledger: Ledger | AsyncLedger, payments: Payments) -> Any:
    @function_tool
    @ledger.tool()
    async def issue_credit(ctx: ToolContext[Session], customer: str, amount: int,
                           currency: str) -> dict:
        """Issue a credit to a customer."""
        await asyncio.sleep(0)
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    return issue_credit


def test_a_tool_context_tool_runs_once_per_run(server: LedgerServer, run_id: str) -> None:
    payments = Payments()

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            tool = credit_tool(ledger, payments)
            assert set(tool.params_json_schema["properties"]) == {"customer", "amount",
                                                                  "currency"}
            result = await Runner.run(Agent(name="support", model=scripted(), tools=[tool]),
                                      "credit c-42", context=Session(run_id))
            assert count_notes(outputs(result)) == (1, 2)
            assert len(payments.credits) == 1
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            assert entry.replay_count == 2
            # A second run is a new intent.
            await Runner.run(Agent(name="support", model=scripted(), tools=[tool]),
                             "credit c-42", context=Session(f"{run_id}-2"))
            assert len(payments.credits) == 2

    asyncio.run(main())


def test_without_a_run_id_in_the_context_the_trace_names_the_run(server: LedgerServer) -> None:
    payments = Payments(delay=0)
    with Ledger(server.address) as ledger:
        tool = credit_tool(ledger, payments)
        first = Runner.run_sync(Agent(name="s", model=scripted(), tools=[tool]), "go",
                                context={"user": "u-1"})  # a dict without run_id
        second = Runner.run_sync(Agent(name="s", model=scripted(), tools=[tool]), "go")
        assert count_notes(outputs(first)) == count_notes(outputs(second)) == (1, 2)
        assert len(payments.credits) == 2  # every run has its own trace
        # A trace id you give is the run's id: the same trace_id, the same intent.
        config = RunConfig(trace_id="trace_0123456789abcdef0123456789abcdef")
        Runner.run_sync(Agent(name="s", model=scripted(), tools=[tool]), "go", run_config=config)
        Runner.run_sync(Agent(name="s", model=scripted(), tools=[tool]), "go", run_config=config)
        assert len(payments.credits) == 3
        # With tracing off and no run id anywhere, the tool refuses before claiming: the model
        # reads that nothing was done (not the SDK's "Please try again").
        off = RunConfig(tracing_disabled=True)
        refused = Runner.run_sync(Agent(name="s", model=scripted(parallel=False), tools=[tool]),
                                  "go", run_config=off)
        assert all("called without a run id" in o and "try again" not in o
                   for o in outputs(refused))
        assert len(payments.credits) == 3
        with pytest.raises(NoRunId):  # the wrapper itself, called outside any run
            asyncio.run(_direct(ledger))


async def _direct(ledger: Ledger) -> Any:
    @ledger.tool()
    async def issue_credit(customer: str) -> dict:
        return {}

    return await issue_credit("c-42")


def test_a_tool_that_refuses_before_acting_is_retryable(server: LedgerServer,
                                                        run_id: str) -> None:
    payments = Payments(delay=0)
    sent: list[int] = []
    with Ledger(server.address) as ledger:
        @function_tool
        @ledger.tool()
        def send_reply(ctx: ToolContext[Session], ticket: str, text: str) -> str:
            """Reply to a ticket."""
            payments.refuse_once()  # a 429: NotExecuted, nothing was sent
            sent.append(current_attempt().number)
            return "sent"

        args = {"ticket": "t-1", "text": "hi"}
        model = ScriptedModel([[function_call("send_reply", args, call_id="c-1")],
                               [assistant_message("I will try again later.")]])
        result = Runner.run_sync(Agent(name="s", model=model, tools=[send_reply]), "reply",
                                 context=Session(run_id))
        assert "error occurred" in outputs(result)[0]  # the SDK told the model it failed
        entry = ledger.lookup(run_id=run_id, tool="send_reply", arguments=args)
        assert (entry.status, entry.retryable) == (Status.FAILED, True)
        # The same intent again runs it (attempt 2); once more replays.
        again = Runner.run_sync(Agent(name="s", model=scripted("send_reply", args),
                                      tools=[send_reply]), "reply", context=Session(run_id))
        assert sent == [2]
        assert count_notes(outputs(again)) == (1, 2) and "sent" in outputs(again)


# --- unknown outcomes, confirm, strict mode, the run id -----------------------------------------


def twice(tool: str = "issue_credit", args: Any = None) -> ScriptedModel:
    """The model calls the tool, reads the answer, calls it again (the repeat), then stops."""
    args = CREDIT if args is None else args
    return ScriptedModel([[function_call(tool, args, call_id="call-1")],
                          [function_call(tool, args, call_id="call-2")],
                          [assistant_message("done")]])


def read(output: str) -> Any:
    """The SDK hands the model a tool's dict as Python's repr or JSON: read either."""
    try:
        return json.loads(output)
    except ValueError:
        return ast.literal_eval(output)


def test_an_error_after_acting_is_unknown_and_the_model_reads_the_note(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    with Ledger(server.address) as ledger:
        @function_tool
        @ledger.tool()
        def issue_credit(ctx: ToolContext[Session], customer: str, amount: int,
                         currency: str) -> dict:
            """Issue a credit to a customer."""
            payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
            raise TimeoutError("the payments API timed out")  # the SDK: "Please try again."

        result = Runner.run_sync(Agent(name="s", model=twice(), tools=[issue_credit]), "credit",
                                 context=Session(run_id))
        assert [read(o) for o in outputs(result)] == [UNKNOWN_VIEW, UNKNOWN_VIEW]
        assert len(payments.credits) == 1


def test_with_confirm_the_model_reads_the_result_found(server: LedgerServer,
                                                     run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            @function_tool
            @ledger.tool(confirm=payments.confirm, confirm_delay=0)
            async def issue_credit(ctx: ToolContext[Session], customer: str, amount: int,
                                   currency: str) -> dict:
                """Issue a credit to a customer."""
                payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
                raise TimeoutError("the payments API timed out")

            result = await Runner.run(Agent(name="s", model=twice(), tools=[issue_credit]),
                                      "credit", context=Session(run_id))
            first, again = (read(o) for o in outputs(result))
            assert first == {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}
            assert again["status"] == "already_done" and again["result"] == first
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            # Settled by the first call under its own claim (its claim token, not a Reconcile):
            # nobody is recorded as resolved_by (clients/parity.json, settlement.own_outcome).
            assert (entry.status, entry.resolved_by) == (Status.SUCCEEDED, "")

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_a_timeout_before_acting_with_confirm_is_not_found_and_the_next_call_acts_once(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    calls: list[int] = []
    with Ledger(server.address) as ledger:
        @function_tool
        @ledger.tool(confirm=payments.confirm, confirm_delay=0)
        def issue_credit(ctx: ToolContext[Session], customer: str, amount: int,
                         currency: str) -> dict:
            """Issue a credit to a customer."""
            calls.append(current_attempt().number)
            if len(calls) == 1:
                raise TimeoutError("the payments API did not answer")
            return payments.issue_credit(customer, amount, currency,
                                         current_attempt().external_ref)

        result = Runner.run_sync(Agent(name="s", model=twice(), tools=[issue_credit]), "credit",
                                 context=Session(run_id))
        first, second = (read(o) for o in outputs(result))
        assert first == NOT_PERFORMED_VIEW
        assert second["credit_id"] == "cr-001"
        assert calls == [1, 2] and len(payments.credits) == 1


def test_strict_mode_refuses_a_tool_without_confirm(server: LedgerServer) -> None:
    with Ledger(server.address, require_confirm=True) as ledger:
        with pytest.raises(ValueError, match="issue_credit has no confirm="):
            @function_tool
            @ledger.tool()
            def issue_credit(ctx: ToolContext[Session], customer: str) -> dict:
                """Issue a credit to a customer."""
                return {}


def test_a_missing_run_id_is_logged_and_the_model_is_not_told_to_try_again(
        server: LedgerServer, caplog: pytest.LogCaptureFixture) -> None:
    with Ledger(server.address) as ledger, caplog.at_level(logging.ERROR):
        @function_tool
        @ledger.tool()
        def refund(ctx: ToolContext[dict], order: str) -> dict:
            """Refund an order."""
            raise AssertionError("not called without a run id")

        off = RunConfig(tracing_disabled=True)
        for _ in range(2):
            result = Runner.run_sync(Agent(name="s", model=twice("refund", {"order": "o-1"}),
                                           tools=[refund]), "refund", run_config=off)
            for output in outputs(result):
                assert read(output)["status"] == "not_executed"
                assert "without a run id" in output and "try again" not in output
    errors = [r for r in caplog.records if r.levelno == logging.ERROR
              and r.name == "idempotency_ledger"]
    assert len(errors) == 1 and "refund" in errors[0].getMessage()  # once per tool
    assert "Runner.run(..., context=...)" in errors[0].getMessage()  # names the fix


# --- the SDK's own timeout: the ledger's answer wins --------------------------------------------


def credit_then_hang(ledger: Ledger | AsyncLedger, payments: Payments, *, timeout: float,
                     act: bool = True, **sdk: Any) -> Any:
    """issue_credit under ``function_tool(timeout=...)``: it credits (unless `act` is False),
    then its answer never comes back."""
    @function_tool(timeout=timeout, **sdk)
    @ledger.tool(confirm=payments.confirm, confirm_delay=0)
    async def issue_credit(ctx: ToolContext[Session], customer: str, amount: int,
                           currency: str) -> dict:
        """Issue a credit to a customer."""
        if act:
            payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
        await asyncio.sleep(60)
        return {}

    return issue_credit


def one_call() -> ScriptedModel:
    return ScriptedModel([[function_call("issue_credit", CREDIT, call_id="call-1")],
                          [assistant_message("done")]])


@pytest.mark.parametrize("client", [Ledger, AsyncLedger])
def test_the_sdks_timeout_after_acting_reads_what_confirm_found(
        server: LedgerServer, run_id: str, client: type) -> None:
    # The SDK alone would tell the model "Tool 'issue_credit' timed out after 1 seconds." while
    # the credit exists: the adapter stops the action, confirm finds the credit, and the model
    # reads it, as the ledger records it.
    payments = Payments(delay=0)

    async def main() -> None:
        ledger = client(server.address)
        try:
            tool = credit_then_hang(ledger, payments, timeout=1)
            result = await Runner.run(Agent(name="s", model=one_call(), tools=[tool]),
                                      "credit", context=Session(run_id))
            (output,) = outputs(result)
            assert "timed out" not in output
            assert read(output) == {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}
            entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            entry = await entry if asyncio.iscoroutine(entry) else entry
            assert entry.status == Status.SUCCEEDED
            assert [a.external_ref for a in payments.confirmed] == [entry.external_ref]
        finally:
            closed = ledger.close()
            if asyncio.iscoroutine(closed):
                await closed

    asyncio.run(main())
    assert len(payments.credits) == 1


@pytest.mark.parametrize("client", [Ledger, AsyncLedger])
def test_the_sdks_timeout_while_nothing_shows_yet_reads_unknown(
        server: LedgerServer, run_id: str, client: type) -> None:
    # Stopped before its request reached the payments API, as far as the read can tell: the
    # request may still land, so "nothing yet" is no proof. The outcome stays unknown, and the
    # model is told not to repeat the call, not that nothing happened.
    payments = Payments(delay=0)

    async def main() -> None:
        ledger = client(server.address)
        try:
            tool = credit_then_hang(ledger, payments, timeout=1, act=False)
            result = await Runner.run(Agent(name="s", model=one_call(), tools=[tool]),
                                      "credit", context=Session(run_id))
            (output,) = outputs(result)
            assert read(output) == UNKNOWN_VIEW
            entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            entry = await entry if asyncio.iscoroutine(entry) else entry
            assert entry.status == Status.UNKNOWN and "ActionStopped" in entry.error
            assert len(payments.confirmed) == 1
        finally:
            closed = ledger.close()
            if asyncio.iscoroutine(closed):
                await closed

    asyncio.run(main())
    assert payments.credits == []


def test_the_sdks_timeout_with_raise_exception_is_left_to_the_sdk(server: LedgerServer,
                                                                  run_id: str) -> None:
    # timeout_behavior="raise_exception" asks for the SDK's ToolTimeoutError: the run fails,
    # and the call's outcome is recorded UNKNOWN (the cancellation), for a repeat or the
    # reconciler to settle.
    payments = Payments(delay=0)

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            tool = credit_then_hang(ledger, payments, timeout=1,
                                    timeout_behavior="raise_exception")
            with pytest.raises(ToolTimeoutError):
                await Runner.run(Agent(name="s", model=one_call(), tools=[tool]), "credit",
                                 context=Session(run_id))
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            assert entry.status == Status.UNKNOWN and payments.confirmed == []

    asyncio.run(main())


def test_the_sdks_timeout_before_the_tool_acted_is_the_sdks(server: LedgerServer,
                                                            run_id: str) -> None:
    # Still waiting on a duplicate in flight when the SDK's timeout runs out: nothing acted, so
    # the call is cancelled as without the ledger and the model reads the SDK's words.
    payments = Payments(delay=3)

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            first = asyncio.ensure_future(ledger.run_once(
                run_id, "issue_credit", CREDIT, lambda a: asyncio.to_thread(
                    payments.issue_credit, **CREDIT, reference=a.external_ref)))
            await asyncio.sleep(0.5)  # the first call holds the claim, crediting slowly
            tool = credit_then_hang(ledger, payments, timeout=1)
            result = await Runner.run(Agent(name="s", model=one_call(), tools=[tool]),
                                      "credit", context=Session(run_id))
            assert outputs(result) == ["Tool 'issue_credit' timed out after 1 seconds."]
            assert not (await first).replayed

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_the_sdks_context_without_the_adapter_imported_names_the_import(
        server: LedgerServer, run_id: str) -> None:
    # In a fresh interpreter that never imported idempotency_ledger.openai_agents: the call is
    # refused before anything is claimed, and the error says which module to import.
    program = "\n".join([
        "import sys",
        "from agents.tool_context import ToolContext",
        "from idempotency_ledger import Ledger, NoRunId",
        "ledger = Ledger(sys.argv[1])",
        "@ledger.tool()",
        "def issue_credit(ctx: ToolContext, customer: str) -> dict:",
        "    raise AssertionError('not called')",
        "ctx = ToolContext(context={'run_id': sys.argv[2]}, tool_name='issue_credit',",
        "                  tool_call_id='call-1', tool_arguments='{}')",
        "try:",
        "    issue_credit(ctx, 'c-42')",
        "except NoRunId as e:",
        "    print(e)",
    ])
    done = subprocess.run([sys.executable, "-c", program, server.address, run_id],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "import idempotency_ledger.openai_agents" in done.stdout
    with Ledger(server.address) as ledger:
        assert list(ledger.list_entries(run_id=run_id)) == []
