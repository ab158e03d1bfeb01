"""pydantic-ai (the real package, its offline FunctionModel): the decorator on a RunContext tool
and the LedgerToolset, against the real server."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from scenario import (
    CREDIT,
    CREDIT_RESPELLED,
    NOT_PERFORMED_VIEW,
    REPLAY_NOTE,
    UNKNOWN_VIEW,
    Payments,
    count_notes,
)

from idempotency_ledger import AsyncLedger, Ledger, NoRunId, NotExecuted, Status, current_attempt
from idempotency_ledger.pydantic_ai import LedgerToolset
from idempotency_ledger.testing import LedgerServer


def scripted(tool: str = "issue_credit", first_args: Any = None,
             parallel: bool = True) -> FunctionModel:
    """Two parallel calls (or one), then the same intent respelled, then a final answer."""
    first_args = CREDIT if first_args is None else first_args

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn == 0:
            calls = [ToolCallPart(tool, first_args, tool_call_id=f"call-{n}")
                     for n in range(1, 3 if parallel else 2)]
            return ModelResponse(parts=calls)
        if turn == 1:
            again = CREDIT_RESPELLED if first_args is CREDIT else dict(
                reversed(list(first_args.items())))
            return ModelResponse(parts=[ToolCallPart(tool, again, tool_call_id="call-3")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def tool_outputs(messages: list[ModelMessage]) -> list[Any]:
    return [part.content for m in messages for part in m.parts
            if isinstance(part, ToolReturnPart)]


def test_a_run_context_tool_runs_once_per_run(server: LedgerServer, run_id: str) -> None:
    payments = Payments()
    ledger = Ledger(server.address)
    agent = Agent(scripted())

    @agent.tool
    @ledger.tool()
    def issue_credit(ctx: RunContext[None], customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        return payments.issue_credit(customer, amount, currency,
                                     reference=current_attempt().external_ref)

    # The schema the model sees is the function's, without the context.
    (definition,) = agent._function_toolset.tools.values()  # noqa: SLF001
    assert set(definition.tool_def.parameters_json_schema["properties"]) == {
        "customer", "amount", "currency"}
    try:
        result = agent.run_sync("credit c-42", run_id=run_id)
        results, notes = count_notes(tool_outputs(result.all_messages()))
        assert (results, notes) == (1, 2)
        assert len(payments.credits) == 1
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        assert entry.replay_count == 2 and entry.external_ref == payments.credits[0]["reference"]
        assert entry.arguments_json == '{"amount":200,"currency":"EUR","customer":"c-42"}'
        # A second run (a fresh run id) is a new intent: it acts again.
        again = agent.run_sync("credit c-42 again")
        assert count_notes(tool_outputs(again.all_messages())) == (1, 2)
        assert len(payments.credits) == 2
    finally:
        ledger.close()


def test_model_retry_from_not_executed_leaves_the_intent_retryable(server: LedgerServer,
                                                               run_id: str) -> None:
    payments = Payments(delay=0)
    ledger = Ledger(server.address)
    calls = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn < 2:  # the same call again after the retry prompt
            return ModelResponse(parts=[ToolCallPart("issue_credit", CREDIT)])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(respond))

    @agent.tool(retries=2)
    @ledger.tool()
    def issue_credit(ctx: RunContext[None], customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        calls.append(current_attempt().number)
        if len(calls) == 1:
            # pydantic-ai's idiom for "I did not act, call me again".
            raise ModelRetry("the payments API is busy, call again") from NotExecuted("busy")
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    try:
        agent.run_sync("credit c-42", run_id=run_id)
        assert calls == [1, 2] and len(payments.credits) == 1
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        assert (entry.status, entry.attempt) == (Status.SUCCEEDED, 2)
    finally:
        ledger.close()


def test_the_toolset_makes_every_tool_run_once(server: LedgerServer, run_id: str) -> None:
    payments = Payments()
    toolset = FunctionToolset()
    refused: list[str] = []

    @toolset.tool_plain
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    @toolset.tool_plain
    def send_reply(ticket: str, text: str) -> str:
        """Reply to a support ticket."""
        refused.append(ticket)
        payments.refuse_once()  # NotExecuted: nothing was sent
        return "sent"

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            agent = Agent(scripted(), toolsets=[LedgerToolset(toolset, ledger,
                                                              tools={"issue_credit"})])
            result = await agent.run("credit c-42", run_id=run_id)
            assert count_notes(tool_outputs(result.all_messages())) == (1, 2)
            assert len(payments.credits) == 1
            await agent.run("credit c-42", run_id=f"{run_id}-2")
            assert len(payments.credits) == 2

            # A tool that refuses before acting: FAILED retryable, and the next call runs it.
            replies = Agent(scripted("send_reply", {"ticket": "t-1", "text": "hi"},
                                     parallel=False),
                            toolsets=[LedgerToolset(toolset, ledger)])
            with pytest.raises(Exception, match="429"):
                await replies.run("reply", run_id=f"{run_id}-3")
            entry = await ledger.lookup(run_id=f"{run_id}-3", tool="send_reply",
                                        arguments={"ticket": "t-1", "text": "hi"})
            assert (entry.status, entry.retryable) == (Status.FAILED, True)
            done = await replies.run("reply", run_id=f"{run_id}-3")
            outputs = tool_outputs(done.all_messages())
            assert outputs == ["sent", {"status": "already_done", "note": REPLAY_NOTE,
                                        "result": "sent"}]
            entry = await ledger.lookup(entry.key)
            assert (entry.status, entry.attempt) == (Status.SUCCEEDED, 2)

    asyncio.run(main())


def test_the_decorated_tool_keeps_what_pydantic_ai_reads(server: LedgerServer) -> None:
    ledger = Ledger(server.address)

    async def credit(ctx: RunContext[None], customer: str, amount: int = 1) -> dict:
        """Credit."""
        return {}

    wrapped = ledger.tool()(credit)
    try:
        assert inspect.signature(wrapped) == inspect.signature(credit, eval_str=True)
        assert inspect.iscoroutinefunction(wrapped)
        assert wrapped.__doc__ == "Credit." and wrapped.__wrapped__ is credit
    finally:
        ledger.close()


# --- unknown outcomes, confirm, strict mode, the run id -----------------------------------------


def twice(tool: str = "issue_credit", args: Any = None) -> FunctionModel:
    """The model calls the tool, reads the answer, calls it again (the repeat), then stops."""
    args = CREDIT if args is None else args

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn < 2:
            return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=f"call-{turn}")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def test_a_model_retry_after_acting_is_unknown_and_the_model_reads_the_note(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    with Ledger(server.address) as ledger:
        agent = Agent(twice())

        @agent.tool(retries=3)
        @ledger.tool()
        def issue_credit(ctx: RunContext[None], customer: str, amount: int,
                         currency: str) -> dict:
            """Issue a credit to a customer."""
            payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
            # The usual way to tell pydantic-ai "call me again": here after the credit went
            # through and only its answer was lost.
            raise ModelRetry("the payments API timed out, call again")

        result = agent.run_sync("credit c-42", run_id=run_id)
        assert tool_outputs(result.all_messages()) == [UNKNOWN_VIEW, UNKNOWN_VIEW]
        assert len(payments.credits) == 1
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        assert entry.status == Status.UNKNOWN and entry.error.startswith("ModelRetry")


def test_with_confirm_the_model_reads_the_result_found(server: LedgerServer,
                                                     run_id: str) -> None:
    payments = Payments(delay=0)
    toolset = FunctionToolset()

    @toolset.tool_plain
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
        raise ModelRetry("the payments API timed out, call again")

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            wrapped = LedgerToolset(toolset, ledger, confirm={"issue_credit": payments.confirm},
                                    confirm_delay=0)
            result = await Agent(twice(), toolsets=[wrapped]).run("credit", run_id=run_id)
            first, again = tool_outputs(result.all_messages())
            assert first == {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}
            assert again == {"status": "already_done", "note": REPLAY_NOTE, "result": first}
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            # Settled by the first call under its own claim (its claim token, not a Reconcile):
            # nobody is recorded as resolved_by (clients/parity.json, settlement.own_outcome).
            assert (entry.status, entry.resolved_by) == (Status.SUCCEEDED, "")
            assert wrapped.ledger_tools[0].name == "issue_credit"

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_a_timeout_before_acting_with_confirm_is_not_found_and_the_next_call_acts_once(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    calls: list[int] = []
    with Ledger(server.address) as ledger:
        agent = Agent(twice())

        @agent.tool
        @ledger.tool(confirm=payments.confirm, confirm_delay=0)
        def issue_credit(ctx: RunContext[None], customer: str, amount: int,
                         currency: str) -> dict:
            """Issue a credit to a customer."""
            calls.append(current_attempt().number)
            if len(calls) == 1:
                raise TimeoutError("the payments API did not answer")  # nothing reached it
            return payments.issue_credit(customer, amount, currency,
                                         current_attempt().external_ref)

        result = agent.run_sync("credit c-42", run_id=run_id)
        first, second = tool_outputs(result.all_messages())
        assert first == NOT_PERFORMED_VIEW
        assert second == {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}
        assert calls == [1, 2] and len(payments.credits) == 1
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        assert (entry.status, entry.attempt) == (Status.SUCCEEDED, 2)


def test_strict_mode_refuses_a_tool_without_confirm(server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    toolset = FunctionToolset()

    @toolset.tool_plain
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    with Ledger(server.address, require_confirm=True) as ledger:
        with pytest.raises(ValueError, match="issue_credit has no confirm="):
            ledger.tool()(issue_credit)
        with pytest.raises(ValueError, match="require_confirm=True"):
            LedgerToolset(toolset, ledger, tools={"issue_credit"})
        # Every tool of the toolset: refused when the run lists the tools, before any call.
        with pytest.raises(ValueError, match="issue_credit has no confirm="):
            Agent(twice(), toolsets=[LedgerToolset(toolset, ledger)]).run_sync("x", run_id=run_id)
        assert payments.credits == []
        strict = LedgerToolset(toolset, ledger, confirm={"issue_credit": payments.confirm})
        Agent(twice(), toolsets=[strict]).run_sync("x", run_id=run_id)
        assert len(payments.credits) == 1


def test_a_missing_run_id_reaches_the_developer(server: LedgerServer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    toolset = FunctionToolset()

    @toolset.tool_plain
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        raise AssertionError("not called without a run id")

    with Ledger(server.address) as ledger, caplog.at_level(logging.ERROR):
        wrapped = LedgerToolset(toolset, ledger, run_id=lambda ctx: None)
        for _ in range(2):
            with pytest.raises(NoRunId, match="no run id"):
                Agent(twice(), toolsets=[wrapped]).run_sync("credit")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "issue_credit" in errors[0].getMessage()  # once per tool


# --- the top-level README's first snippet, as written -------------------------------------------

TOP_README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_top_level_readmes_snippet_works_without_importing_the_adapter(
        server: LedgerServer, run_id: str) -> None:
    """``@agent.tool`` over ``@ledger.tool()`` on a ``RunContext`` tool, with pydantic-ai's own
    import and no adapter's (the repository's README, "Inside your agent framework"): the
    wrapper knows pydantic-ai's RunContext by itself and keys the call by ``ctx.run_id``. Run in
    a fresh interpreter that never imports idempotency_ledger.pydantic_ai, with pydantic-ai's
    own TestModel."""
    section = TOP_README.read_text(encoding="utf-8").split("## Inside your agent framework")[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "@ledger.tool()" in snippet and "idempotency_ledger" not in snippet
    program = "\n".join([
        "import json, sys",
        "from pydantic_ai import Agent, RunContext",
        "from pydantic_ai.models.test import TestModel",
        "from idempotency_ledger import Ledger",
        "ledger = Ledger(sys.argv[1])",
        "agent = Agent(TestModel())",
        snippet,
        "for _ in range(2):",
        "    agent.run_sync('credit c-42', run_id=sys.argv[2])",
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('idempotency_ledger'))))",
    ])
    done = subprocess.run([sys.executable, "-c", program, server.address, run_id],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "idempotency_ledger.pydantic_ai" not in json.loads(done.stdout)
    with Ledger(server.address) as ledger:
        (entry,) = ledger.list_entries(run_id=run_id)
    # One effect for the run, keyed by ctx.run_id; the second run of the same id replayed it.
    assert (entry.tool, entry.status, entry.replay_count) == ("issue_credit", Status.SUCCEEDED, 1)
    assert set(json.loads(entry.arguments_json)) == {"customer", "amount", "currency"}
