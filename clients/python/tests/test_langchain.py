"""LangChain v1 (the real packages, langchain_core's fake chat model): LedgerMiddleware on
create_agent, sync and async, and @ledger.tool() on a ToolRuntime tool, against the real
server."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import ToolException, tool
from scenario import (
    CREDIT,
    NOT_PERFORMED_VIEW,
    REPLAY_NOTE,
    UNKNOWN_VIEW,
    Payments,
    count_notes,
)


from idempotency_ledger import AsyncLedger, Ledger, NoRunId, NotExecuted, Status, current_attempt
from idempotency_ledger.langchain import LedgerMiddleware
from idempotency_ledger.testing import LedgerServer

# The third call as a model's JSON would parse: members reordered, 2e2 read as a float.
CREDIT_RESPELLED = {"currency": "EUR", "amount": 2e2, "customer": "c-42"}


class ToolCallingFakeModel(FakeMessagesListChatModel):
    """langchain_core's fake chat model, told it can call tools (it answers from its list)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFakeModel:
        return self


def scripted(name: str = "issue_credit", args: dict | None = None,
             parallel: bool = True) -> ToolCallingFakeModel:
    args = CREDIT if args is None else args
    again = CREDIT_RESPELLED if args is CREDIT else dict(reversed(list(args.items())))
    first = [{"name": name, "args": args, "id": f"call-{n}"} for n in range(1, 3 if parallel else 2)]
    return ToolCallingFakeModel(responses=[
        AIMessage("", tool_calls=first),
        AIMessage("", tool_calls=[{"name": name, "args": again, "id": "call-3"}]),
        AIMessage("done"),
    ])


def tool_messages(state: dict) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def credit_tool(payments: Payments) -> Any:
    @tool
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    return issue_credit


def test_the_middleware_runs_each_intent_once_per_run(server: LedgerServer) -> None:
    payments = Payments()
    with Ledger(server.address) as ledger:
        def agent() -> Any:
            return create_agent(scripted(), tools=[credit_tool(payments)],
                                middleware=[LedgerMiddleware(ledger)])

        run_id = str(uuid.uuid4())
        state = agent().invoke({"messages": [{"role": "user", "content": "credit c-42"}]},
                               config={"run_id": run_id})
        messages = tool_messages(state)
        assert count_notes([m.content for m in messages]) == (1, 2)
        assert all(m.status == "success" for m in messages)
        assert len(payments.credits) == 1
        replay = json.loads(next(m.content for m in messages if REPLAY_NOTE in m.content))
        assert replay["result"] == json.loads(next(m.content for m in messages
                                                   if REPLAY_NOTE not in m.content))
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        assert entry.replay_count == 2 and entry.external_ref == payments.credits[0]["reference"]
        # A new invocation is a new run: it acts again.
        agent().invoke({"messages": [{"role": "user", "content": "again"}]},
                       config={"run_id": str(uuid.uuid4())})
        assert len(payments.credits) == 2
        # Without a run id in the config the call is refused before anything is claimed.
        with pytest.raises(NoRunId, match="run_id"):
            agent().invoke({"messages": [{"role": "user", "content": "credit"}]})
        assert len(payments.credits) == 2


def test_the_async_agent_keyed_by_thread(server: LedgerServer) -> None:
    payments = Payments()
    thread = f"thread-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            for _ in range(2):  # two invocations of one thread: one intent
                agent = create_agent(scripted(), tools=[credit_tool(payments)],
                                     middleware=[LedgerMiddleware(ledger, run_id="thread")])
                state = await agent.ainvoke(
                    {"messages": [{"role": "user", "content": "credit c-42"}]},
                    config={"configurable": {"thread_id": thread}})
                assert len(tool_messages(state)) == 3
            assert len(payments.credits) == 1
            entry = await ledger.lookup(run_id=thread, tool="issue_credit", arguments=CREDIT)
            assert entry.replay_count == 5

    asyncio.run(main())


def test_a_tool_that_refuses_before_acting_is_retryable(server: LedgerServer) -> None:
    payments = Payments(delay=0)
    args = {"ticket": "t-1", "text": "hi"}

    @tool
    def send_reply(ticket: str, text: str) -> str:
        """Reply to a ticket."""
        payments.refuse_once()  # a 429 the first time: NotExecuted
        return f"sent on attempt {current_attempt().number}"

    run_id = str(uuid.uuid4())
    with Ledger(server.address) as ledger:
        def agent() -> Any:
            return create_agent(scripted("send_reply", args, parallel=False), tools=[send_reply],
                                middleware=[LedgerMiddleware(ledger)])

        with pytest.raises(NotExecuted):
            agent().invoke({"messages": [{"role": "user", "content": "reply"}]},
                           config={"run_id": run_id})
        entry = ledger.lookup(run_id=run_id, tool="send_reply", arguments=args)
        assert (entry.status, entry.retryable) == (Status.FAILED, True)
        state = agent().invoke({"messages": [{"role": "user", "content": "reply"}]},
                               config={"run_id": run_id})  # the runtime retries the run
        assert [m.content for m in tool_messages(state)][0] == "sent on attempt 2"


def test_arguments_the_tool_node_refuses_reach_the_model_and_stay_retryable(
        server: LedgerServer) -> None:
    payments = Payments(delay=0)
    bad = {"customer": "c-42", "amount": "lots", "currency": "EUR"}
    model = ToolCallingFakeModel(responses=[
        AIMessage("", tool_calls=[{"name": "issue_credit", "args": bad, "id": "c-1"}]),
        AIMessage("sorry"),
    ])
    run_id = str(uuid.uuid4())
    with Ledger(server.address) as ledger:
        agent = create_agent(model, tools=[credit_tool(payments)],
                             middleware=[LedgerMiddleware(ledger)])
        (message,) = tool_messages(agent.invoke({"messages": [{"role": "user", "content": "x"}]},
                                                config={"run_id": run_id}))
        assert message.status == "error" and "amount" in message.content
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=bad)
        assert (entry.status, entry.retryable) == (Status.FAILED, True)
        assert payments.credits == []


def test_a_tool_runtime_tool_is_keyed_by_the_configs_run_id(server: LedgerServer) -> None:
    payments = Payments()
    run_id = str(uuid.uuid4())
    with Ledger(server.address) as ledger:
        @tool
        @ledger.tool()
        def issue_credit(customer: str, amount: int, currency: str,
                         runtime: ToolRuntime) -> dict:
            """Issue a credit to a customer."""
            return payments.issue_credit(customer, amount, currency,
                                         current_attempt().external_ref)

        assert set(issue_credit.tool_call_schema.model_json_schema()["properties"]) == {
            "customer", "amount", "currency"}
        state = create_agent(scripted(), tools=[issue_credit]).invoke(
            {"messages": [{"role": "user", "content": "credit"}]}, config={"run_id": run_id})
        assert count_notes([m.content for m in tool_messages(state)]) == (1, 2)
        assert len(payments.credits) == 1
        assert ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT).replay_count == 2


# --- unknown outcomes, confirm, strict mode, the run id -----------------------------------------


def twice(name: str = "issue_credit", args: dict | None = None) -> ToolCallingFakeModel:
    """The model calls the tool, reads the answer, calls it again (the repeat), then stops."""
    args = CREDIT if args is None else args
    return ToolCallingFakeModel(responses=[
        AIMessage("", tool_calls=[{"name": name, "args": args, "id": "call-1"}]),
        AIMessage("", tool_calls=[{"name": name, "args": args, "id": "call-2"}]),
        AIMessage("done"),
    ])


def handled_credit_tool(payments: Payments, *, act_first: bool = True,
                        not_executed: bool = False) -> Any:
    """A tool written the LangChain way: it reports the payments API's timeout with a
    ToolException it handles itself (the model reads the error text)."""
    calls: list[int] = []

    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer."""
        calls.append(current_attempt().number)
        if len(calls) == 1:
            if act_first:
                payments.issue_credit(customer, amount, currency, current_attempt().external_ref)
            if not_executed:
                raise ToolException("the payments API refused: try again") from NotExecuted()
            raise ToolException("the payments API timed out: try again")
        return payments.issue_credit(customer, amount, currency, current_attempt().external_ref)

    made = tool(issue_credit)
    made.handle_tool_error = True
    return made, calls


def test_a_handled_tool_exception_after_acting_is_unknown_and_the_model_reads_the_note(
        server: LedgerServer) -> None:
    payments = Payments(delay=0)
    with Ledger(server.address) as ledger:
        agent = create_agent(twice(), tools=[handled_credit_tool(payments)[0]],
                             middleware=[LedgerMiddleware(ledger)])
        run_id = uuid.uuid4()  # as LangChain types it
        state = agent.invoke({"messages": [{"role": "user", "content": "credit"}]},
                             config={"run_id": run_id})
        messages = tool_messages(state)
        assert [json.loads(m.content) for m in messages] == [UNKNOWN_VIEW, UNKNOWN_VIEW]
        assert all(m.status == "success" for m in messages)
        assert len(payments.credits) == 1
        entry = ledger.lookup(run_id=str(run_id), tool="issue_credit", arguments=CREDIT)
        assert entry.status == Status.UNKNOWN


def test_with_confirm_the_model_reads_the_result_found(server: LedgerServer) -> None:
    payments = Payments(delay=0)
    run_id = str(uuid.uuid4())

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            middleware = LedgerMiddleware(ledger, confirm={"issue_credit": payments.confirm},
                                          confirm_delay=0)
            agent = create_agent(twice(), tools=[handled_credit_tool(payments)[0]],
                                 middleware=[middleware])
            state = await agent.ainvoke({"messages": [{"role": "user", "content": "credit"}]},
                                        config={"run_id": run_id})
            first, again = tool_messages(state)
            assert json.loads(first.content) == {"credit_id": "cr-001", "amount": 200,
                                                 "currency": "EUR"}
            assert json.loads(again.content)["result"] == json.loads(first.content)
            entry = await ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
            # Settled by the first call under its own claim (its claim token, not a Reconcile):
            # nobody is recorded as resolved_by (clients/parity.json, settlement.own_outcome).
            assert (entry.status, entry.resolved_by) == (Status.SUCCEEDED, "")
            assert [t.name for t in middleware.ledger_tools] == ["issue_credit"]

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_a_timeout_before_acting_with_confirm_is_not_found_and_the_next_call_acts_once(
        server: LedgerServer) -> None:
    payments = Payments(delay=0)
    credit, calls = handled_credit_tool(payments, act_first=False)
    run_id = str(uuid.uuid4())
    with Ledger(server.address) as ledger:
        agent = create_agent(twice(), tools=[credit], middleware=[LedgerMiddleware(
            ledger, confirm={"issue_credit": payments.confirm}, confirm_delay=0)])
        state = agent.invoke({"messages": [{"role": "user", "content": "credit"}]},
                             config={"run_id": run_id})
        first, second = tool_messages(state)
        assert json.loads(first.content) == NOT_PERFORMED_VIEW
        assert json.loads(second.content)["credit_id"] == "cr-001"
        assert calls == [1, 2] and len(payments.credits) == 1


def test_a_tool_exception_from_not_executed_is_retryable(server: LedgerServer) -> None:
    payments = Payments(delay=0)
    credit, calls = handled_credit_tool(payments, act_first=False, not_executed=True)
    run_id = str(uuid.uuid4())
    with Ledger(server.address) as ledger:
        agent = create_agent(twice(), tools=[credit], middleware=[LedgerMiddleware(ledger)])
        state = agent.invoke({"messages": [{"role": "user", "content": "credit"}]},
                             config={"run_id": run_id})
        refused, second = tool_messages(state)
        # The tool's own error message, as without the ledger; then the next call acts.
        assert refused.status == "error" and "refused" in refused.content
        assert json.loads(second.content)["credit_id"] == "cr-001"
        assert calls == [1, 2] and len(payments.credits) == 1


def test_strict_mode_refuses_a_tool_without_confirm(server: LedgerServer) -> None:
    payments = Payments(delay=0)
    with Ledger(server.address, require_confirm=True) as ledger:
        with pytest.raises(ValueError, match="issue_credit has no confirm="):
            LedgerMiddleware(ledger, tools=["issue_credit"])
        agent = create_agent(twice(), tools=[credit_tool(payments)],
                             middleware=[LedgerMiddleware(ledger)])
        with pytest.raises(ValueError, match="issue_credit has no confirm="):
            agent.invoke({"messages": [{"role": "user", "content": "credit"}]},
                         config={"run_id": str(uuid.uuid4())})
        assert payments.credits == []


def test_a_missing_run_id_reaches_the_developer(server: LedgerServer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    refunded: list[str] = []

    @tool
    def refund_order(order: str) -> str:
        """Refund an order."""
        refunded.append(order)
        return "refunded"

    with Ledger(server.address) as ledger, caplog.at_level(logging.ERROR):
        for _ in range(2):
            agent = create_agent(twice("refund_order", {"order": "o-1"}), tools=[refund_order],
                                 middleware=[LedgerMiddleware(ledger)])
            with pytest.raises(NoRunId, match="run_id"):
                agent.invoke({"messages": [{"role": "user", "content": "refund"}]})
    errors = [r for r in caplog.records if r.levelno == logging.ERROR
              and r.name == "idempotency_ledger"]
    assert len(errors) == 1 and "refund_order" in errors[0].getMessage()  # once per tool
    assert refunded == []


def test_a_missing_run_id_advises_a_key_a_resumed_invocation_keeps(server: LedgerServer) -> None:
    # A fresh run_id per invocation would make the invocation that resumes a paused thread a
    # new intent, which never finds the approval a person gave: the advice keys by the thread.
    refunded: list[str] = []

    @tool
    def refund_order(order: str) -> str:
        """Refund an order."""
        refunded.append(order)
        return "refunded"

    with Ledger(server.address) as ledger:
        @tool
        @ledger.tool()
        def refund_with_runtime(order: str, runtime: ToolRuntime) -> str:
            """Refund an order."""
            refunded.append(order)
            return "refunded"

        def invoke(model: Any, tools: list[Any], middleware: list[Any], config: Any) -> Any:
            return create_agent(model, tools=tools, middleware=middleware).invoke(
                {"messages": [{"role": "user", "content": "refund"}]}, config)

        with pytest.raises(NoRunId) as by_run:
            invoke(twice("refund_order", {"order": "o-1"}), [refund_order],
                   [LedgerMiddleware(ledger)], None)
        advice = str(by_run.value)
        assert 'LedgerMiddleware(ledger, run_id="thread")' in advice
        assert 'config={"configurable": {"thread_id": ...}}' in advice
        assert "the same thread_id when you resume it" in advice and "uuid" not in advice
        with pytest.raises(NoRunId, match="the same thread_id when you resume it"):
            invoke(twice("refund_order", {"order": "o-1"}), [refund_order],
                   [LedgerMiddleware(ledger, run_id="thread")], None)
        with pytest.raises(NoRunId) as by_runtime:
            invoke(twice("refund_with_runtime", {"order": "o-1"}), [refund_with_runtime], [],
                   None)
        assert "the same run_id again whenever you resume it" in str(by_runtime.value)
        assert "uuid" not in str(by_runtime.value)
        assert refunded == []
        # The advice followed: the thread keys the call, and a repeat in it replays.
        thread = {"configurable": {"thread_id": f"thread-{uuid.uuid4().hex[:8]}"}}
        invoke(twice("refund_order", {"order": "o-1"}), [refund_order],
               [LedgerMiddleware(ledger, run_id="thread")], thread)
        assert refunded == ["o-1"]
