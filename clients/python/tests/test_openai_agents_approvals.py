"""OpenAI Agents SDK approvals (the real package, its offline ScriptedModel) against the real
server with an approval policy: a gated ledger tool interrupts the run through the SDK's own
``needs_approval``; the app decides with the person's token and resumes; the ledger alone lets
the tool act."""

from __future__ import annotations

import ast
import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from agents import (
    Agent,
    RunContextWrapper,
    RunState,
    Runner,
    function_tool,
    set_trace_processors,
)
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from conftest import AGENT_TOKEN, APPROVER_NAME, APPROVER_TOKEN

from idempotency_ledger import ApprovalState, AsyncLedger, Status, current_attempt
from idempotency_ledger import openai_agents
from idempotency_ledger.openai_agents import awaiting_entry, decide, gated
from idempotency_ledger.testing import LedgerServer

REFUND = {"order": "o-7", "amount": 250}


@pytest.fixture(autouse=True, scope="module")
def _no_trace_export() -> None:
    set_trace_processors([])


def refund_model() -> ScriptedModel:
    return ScriptedModel([[function_call("issue_refund", REFUND, call_id="call-1")],
                          [assistant_message("done")]])


def refund_agent(ledger: AsyncLedger, refunds: list[dict]) -> Agent[Any]:
    # What a user writes: the ledger tool, and gated() so that the SDK asks the ledger.
    @function_tool
    @ledger.tool()
    async def issue_refund(ctx: ToolContext[Any], order: str, amount: int) -> dict:
        """Refund an order."""
        refunds.append({"order": order, "amount": amount, "ref": current_attempt().external_ref})
        return {"refund_id": f"rf-{len(refunds)}"}

    return Agent(name="support", model=refund_model(),
                 tools=[gated(issue_refund, ledger, pause_retention=5 * 24 * 3600)])


def outputs(result: Any) -> list[Any]:
    # The SDK hands the model str() of a dict tool result.
    return [ast.literal_eval(item["output"]) if item["output"].startswith("{") else item["output"]
            for item in result.to_input_list() if item.get("type") == "function_call_output"]


async def _interrupted(ledger: AsyncLedger, refunds: list[dict], run_id: str) -> tuple[Any, Any]:
    # An earlier call of the run, kept a minute only: the interruption extends the run.
    await ledger.run_once(run_id, "send_reply", {"text": "looking"}, lambda a: "sent",
                          retention=60)
    agent = refund_agent(ledger, refunds)
    result = await Runner.run(agent, "refund o-7", context={"run_id": run_id})
    (interruption,) = result.interruptions
    assert interruption.tool_name == "issue_refund" and refunds == []
    earlier = await ledger.lookup(run_id=run_id, tool="send_reply", arguments={"text": "looking"})
    assert earlier.expires_at is not None
    assert earlier.expires_at - datetime.now(UTC) > timedelta(days=4)  # extend_run
    return agent, result


def test_approve_then_resume_acts_once(approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            agent, result = await _interrupted(ledger, refunds, run_id)
            state = result.to_state()
            (interruption,) = result.interruptions
            entry = await awaiting_entry(approver, state, interruption)
            assert entry.status == Status.AWAITING_APPROVAL
            assert json.loads(entry.arguments_json) == REFUND
            decided = await decide(approver, state, interruption, entry.fingerprint, "approve",
                                   "checked the order")
            assert decided.approval is not None and decided.approval.decided_by == APPROVER_NAME
            resumed = await Runner.run(agent, state)
            assert outputs(resumed) == [{"refund_id": "rf-1"}]
            assert len(refunds) == 1
            used = await ledger.lookup(entry.key)
            assert used.approval is not None and used.approval.state == ApprovalState.USED
            assert used.status == Status.SUCCEEDED

    asyncio.run(main())


def test_deny_the_model_reads_the_denial(approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            agent, result = await _interrupted(ledger, refunds, run_id)
            state = result.to_state()
            (interruption,) = result.interruptions
            entry = await awaiting_entry(approver, state, interruption)
            await decide(approver, state, interruption, entry.fingerprint, "deny",
                         "the order was never paid")
            resumed = await Runner.run(agent, state)
            (read,) = outputs(resumed)
            assert read["status"] == "denied" and "the order was never paid" in read["note"]
            assert refunds == []

    asyncio.run(main())


def test_a_run_state_from_json_resumed_twice_acts_once(approval_server: LedgerServer,
                                                       run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            agent, result = await _interrupted(ledger, refunds, run_id)
            state = result.to_state()
            (interruption,) = result.interruptions
            entry = await awaiting_entry(approver, state, interruption)
            await decide(approver, state, interruption, entry.fingerprint, "approve", "ok")
            saved = json.dumps(state.to_json())  # the app stores the approved state
            # Two workers resume it at once, each from the JSON.
            states = [await RunState.from_json(refund_agent(ledger, refunds), json.loads(saved))
                      for _ in range(2)]
            runs = await asyncio.gather(*(Runner.run(refund_agent(ledger, refunds), s)
                                          for s in states))
            reads = [r for run in runs for r in outputs(run)]
            assert len(refunds) == 1
            assert {"refund_id": "rf-1"} in reads
            others = [r for r in reads if r != {"refund_id": "rf-1"}]
            assert len(others) == 1 and others[0]["status"] in ("already_done", "in_progress")

    asyncio.run(main())


def test_a_forged_approval_in_the_run_state_acts_on_nothing(approval_server: LedgerServer,
                                                            run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger:
            agent, result = await _interrupted(ledger, refunds, run_id)
            state = result.to_state()
            (interruption,) = result.interruptions
            state.approve(interruption)  # approved in the SDK's state only: no Decide
            forged = await RunState.from_json(agent, json.loads(json.dumps(state.to_json())))
            resumed = await Runner.run(agent, forged)
            (read,) = outputs(resumed)
            assert read["status"] == "awaiting_approval" and "person" in read["note"]
            assert refunds == []
            entry = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=REFUND)
            assert entry.status == Status.AWAITING_APPROVAL

    asyncio.run(main())


def test_an_ungated_call_of_a_gated_tool_acts_on_the_claim_needs_approval_won(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger:
            agent = refund_agent(ledger, refunds)
            agent.model = ScriptedModel([
                [function_call("issue_refund", {"order": "o-8", "amount": 40}, call_id="c-1")],
                [assistant_message("done")]])
            result = await Runner.run(agent, "refund o-8", context={"run_id": run_id})
            assert result.interruptions == [] and outputs(result) == [{"refund_id": "rf-1"}]
            entry = await ledger.lookup(run_id=run_id, tool="issue_refund",
                                        arguments={"order": "o-8", "amount": 40})
            assert entry.status == Status.SUCCEEDED and entry.attempt == 1
            assert entry.replay_count == 0

    asyncio.run(main())


def test_a_claim_needs_approval_won_that_no_tool_call_takes_is_given_back(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger:
            tool = refund_agent(ledger, refunds).tools[0]
            small = {"order": "o-8", "amount": 40}
            # The SDK asks, the ledger claims (not gated), and the run ends before the tool
            # is called: the claim is given back as not executed, not left to read UNKNOWN.
            context = RunContextWrapper(context={"run_id": run_id})
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(openai_agents, "RELEASE_UNTAKEN_AFTER_FRACTION_OF_LEASE", 0.01)
                assert await tool.needs_approval(context, small, "c-1") is False
                await asyncio.sleep(1.5)
            entry = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=small)
            assert (entry.status, entry.retryable) == (Status.FAILED, True)
            assert refunds == []

    asyncio.run(main())


# --- several gated calls in one model step -------------------------------------------------------

TWO = [{"order": "o-21", "amount": 300}, {"order": "o-22", "amount": 400}]


def refund_agent_asking_two(ledger: AsyncLedger, refunds: list[dict]) -> Agent[Any]:
    agent = refund_agent(ledger, refunds)
    agent.model = ScriptedModel([[function_call("issue_refund", args, call_id=f"call-{n}")
                                  for n, args in enumerate(TWO, 1)],
                                 [assistant_message("done")]])
    return agent


def outputs_by_call(result: Any) -> dict[str, Any]:
    return {item["call_id"]: ast.literal_eval(item["output"])
            for item in result.to_input_list() if item.get("type") == "function_call_output"}


def test_two_gated_calls_in_one_step_act_once_each_after_approval(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            agent = refund_agent_asking_two(ledger, refunds)
            result = await Runner.run(agent, "refund o-21 and o-22", context={"run_id": run_id})
            assert len(result.interruptions) == 2 and refunds == []
            state = result.to_state()
            for interruption in result.interruptions:
                entry = await awaiting_entry(approver, state, interruption)
                await decide(approver, state, interruption, entry.fingerprint, "approve", "ok")
            resumed = await Runner.run(agent, state)
            assert resumed.interruptions == []
            assert sorted(r["order"] for r in refunds) == ["o-21", "o-22"]  # once each
            assert sorted(str(o) for o in outputs_by_call(resumed).values()) == [
                "{'refund_id': 'rf-1'}", "{'refund_id': 'rf-2'}"]

    asyncio.run(main())


def test_of_two_gated_calls_the_denied_one_never_acts_and_the_model_reads_why(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []

    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            agent = refund_agent_asking_two(ledger, refunds)
            result = await Runner.run(agent, "refund o-21 and o-22", context={"run_id": run_id})
            # Decided elsewhere (the console, the CLI), as the ledger holds each call.
            for args, decision, reason in ((TWO[0], "approve", "checked"),
                                           (TWO[1], "deny", "o-22 was never paid")):
                held = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=args)
                await approver.decide(held.key, held.fingerprint, decision, reason)
            # The app still lets each call through the SDK's gate, the denied one too: its
            # claim answers DENIED, and the model reads the person's reason.
            state = result.to_state()
            for interruption in result.interruptions:
                state.approve(interruption)
            resumed = await Runner.run(agent, state)
            assert [r["order"] for r in refunds] == ["o-21"]
            reads = outputs_by_call(resumed)
            assert reads["call-1"] == {"refund_id": "rf-1"}
            assert reads["call-2"]["status"] == "denied"
            assert "o-22 was never paid" in reads["call-2"]["note"]

    asyncio.run(main())
