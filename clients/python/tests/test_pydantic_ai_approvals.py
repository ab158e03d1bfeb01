"""pydantic-ai approvals (the real package, its offline FunctionModel) against the real server
with an approval policy: a call the ledger holds for a person ends the run as a deferred tool
call (``ApprovalRequired``); the app decides with the person's token and resumes with
``DeferredToolResults``; only the ledger's answer lets the tool act."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from conftest import AGENT_TOKEN, APPROVER_TOKEN
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext, ToolApproved
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset

from idempotency_ledger import ApprovalState, Ledger, Status, current_attempt
from idempotency_ledger.pydantic_ai import LedgerToolset
from idempotency_ledger.testing import LedgerServer

REFUND = {"order": "o-9", "amount": 300}


def refund_model() -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("issue_refund", REFUND,
                                                     tool_call_id="call-1")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def refund_agent(ledger: Ledger, refunds: list[dict]) -> Agent[None, str | DeferredToolRequests]:
    # What a user writes: the ledger tool under the agent's, and DeferredToolRequests as an
    # output the run may end with.
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        refund_model(), output_type=[str, DeferredToolRequests])

    @agent.tool
    @ledger.tool()
    def issue_refund(ctx: RunContext[None], order: str, amount: int) -> dict:
        """Refund an order."""
        refunds.append({"order": order, "ref": current_attempt().external_ref})
        return {"refund_id": f"rf-{len(refunds)}"}

    return agent


def tool_outputs(messages: list[ModelMessage]) -> list[Any]:
    return [part.content for m in messages for part in m.parts
            if isinstance(part, ToolReturnPart)]


def _deferred(agent: Agent[None, Any], run_id: str,
              ledger: Ledger | None = None) -> tuple[Any, Any, dict]:
    if ledger is not None:  # an earlier call of the run, kept a minute only
        ledger.run_once(run_id, "send_reply", {"text": "looking"}, lambda a: "sent",
                        retention=60)
    result = agent.run_sync("refund o-9", run_id=run_id)
    requests = result.output
    assert isinstance(requests, DeferredToolRequests)
    (call,) = requests.approvals
    meta = requests.metadata[call.tool_call_id]["idempotency_ledger"]
    if ledger is not None:  # the run's entries are kept while it is paused
        earlier = ledger.lookup(run_id=run_id, tool="send_reply", arguments={"text": "looking"})
        assert earlier.expires_at is not None
        assert earlier.expires_at - datetime.now(UTC) > timedelta(hours=1)
    return result, call, meta


def test_approve_then_resume_acts_once_and_again_replays(approval_server: LedgerServer,
                                                         run_id: str) -> None:
    refunds: list[dict] = []
    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        agent = refund_agent(ledger, refunds)
        result, call, meta = _deferred(agent, run_id, ledger)
        assert refunds == [] and meta["decide_by"] and "person" in meta["note"]
        approver.decide(meta["key"], meta["fingerprint"], "approve", "checked")
        approved = DeferredToolResults(approvals={call.tool_call_id: True})
        resumed = agent.run_sync(message_history=result.all_messages(),
                                 deferred_tool_results=approved)
        assert resumed.output == "done"
        assert tool_outputs(resumed.new_messages()) == [{"refund_id": "rf-1"}]
        # The same history resumed again: the ledger replays, nothing acts again.
        again = agent.run_sync(message_history=result.all_messages(),
                               deferred_tool_results=approved)
        (replayed,) = tool_outputs(again.new_messages())
        assert replayed["status"] == "already_done" and replayed["result"] == {"refund_id": "rf-1"}
        assert len(refunds) == 1
        entry = ledger.lookup(meta["key"])
        assert entry.approval is not None and entry.approval.state == ApprovalState.USED


def test_deny_the_model_reads_the_denial(approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []
    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        agent = refund_agent(ledger, refunds)
        result, call, meta = _deferred(agent, run_id)
        approver.decide(meta["key"], meta["fingerprint"], "deny", "refunds over 250 need a ticket")
        resumed = agent.run_sync(
            message_history=result.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={call.tool_call_id: True}))
        (read,) = tool_outputs(resumed.new_messages())
        assert read["status"] == "denied" and "refunds over 250 need a ticket" in read["note"]
        assert refunds == []
        assert ledger.lookup(meta["key"]).status == Status.DENIED


def test_a_forged_tool_approved_without_a_decide_acts_on_nothing(approval_server: LedgerServer,
                                                                 run_id: str) -> None:
    refunds: list[dict] = []
    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger:
        agent = refund_agent(ledger, refunds)
        result, call, meta = _deferred(agent, run_id)
        forged = DeferredToolResults(approvals={call.tool_call_id: ToolApproved()})
        resumed = agent.run_sync(message_history=result.all_messages(),
                                 deferred_tool_results=forged)
        (read,) = tool_outputs(resumed.new_messages())
        assert read["status"] == "awaiting_approval" and read["note"] == meta["note"]
        assert refunds == []
        assert ledger.lookup(meta["key"]).status == Status.AWAITING_APPROVAL


def test_the_toolset_defers_a_gated_call_too(approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []
    toolset = FunctionToolset()

    @toolset.tool_plain
    def issue_refund(order: str, amount: int) -> dict:
        """Refund an order."""
        refunds.append({"order": order})
        return {"refund_id": f"rf-{len(refunds)}"}

    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        agent: Agent[None, Any] = Agent(refund_model(), output_type=[str, DeferredToolRequests],
                                        toolsets=[LedgerToolset(toolset, ledger)])
        result, call, meta = _deferred(agent, run_id)
        forged = agent.run_sync(
            message_history=result.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={call.tool_call_id: True}))
        assert tool_outputs(forged.new_messages())[0]["status"] == "awaiting_approval"
        approver.decide(meta["key"], meta["fingerprint"], "approve", "ok")
        resumed = agent.run_sync(
            message_history=result.all_messages(),
            deferred_tool_results=DeferredToolResults(approvals={call.tool_call_id: True}))
        assert tool_outputs(resumed.new_messages()) == [{"refund_id": "rf-1"}]
        assert len(refunds) == 1


# --- several gated calls in one model step -------------------------------------------------------

TWO = [{"order": "o-21", "amount": 300}, {"order": "o-22", "amount": 400}]


def asking_two(read: list[Any]) -> FunctionModel:
    """Asks for both refunds at once, then keeps what it reads of them (`read`)."""
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("issue_refund", args, tool_call_id=f"call-{n}")
                                        for n, args in enumerate(TWO, 1)])
        read.extend(tool_outputs(messages))
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def test_two_gated_calls_in_one_step_act_once_each_after_approval(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []
    read: list[Any] = []
    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        agent = refund_agent(ledger, refunds)
        result = agent.run_sync("refund o-21 and o-22", run_id=run_id, model=asking_two(read))
        requests = result.output
        assert isinstance(requests, DeferredToolRequests) and len(requests.approvals) == 2
        approvals = {}
        for call in requests.approvals:
            meta = requests.metadata[call.tool_call_id]["idempotency_ledger"]
            approver.decide(meta["key"], meta["fingerprint"], "approve", "checked")
            approvals[call.tool_call_id] = True
        resumed = agent.run_sync(message_history=result.all_messages(), model=asking_two(read),
                                 deferred_tool_results=DeferredToolResults(approvals=approvals))
        assert resumed.output == "done"
        assert sorted(r["order"] for r in refunds) == ["o-21", "o-22"]  # once each
        assert sorted(r["refund_id"] for r in read) == ["rf-1", "rf-2"]


def test_of_two_gated_calls_the_denied_one_never_acts_and_the_model_reads_why(
        approval_server: LedgerServer, run_id: str) -> None:
    refunds: list[dict] = []
    read: list[Any] = []
    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        agent = refund_agent(ledger, refunds)
        result = agent.run_sync("refund o-21 and o-22", run_id=run_id, model=asking_two(read))
        requests = result.output
        assert isinstance(requests, DeferredToolRequests)
        # Decided elsewhere (the console, the CLI), as the ledger holds each call.
        for args, decision, reason in ((TWO[0], "approve", "checked"),
                                       (TWO[1], "deny", "o-22 was never paid")):
            held = ledger.lookup(run_id=run_id, tool="issue_refund", arguments=args)
            approver.decide(held.key, held.fingerprint, decision, reason)
        # The app answers every deferred call True, the denied one too: its claim answers
        # DENIED, and the model reads the person's reason.
        approved = DeferredToolResults(approvals={c.tool_call_id: True for c in requests.approvals})
        agent.run_sync(message_history=result.all_messages(), model=asking_two(read),
                       deferred_tool_results=approved)
        assert [r["order"] for r in refunds] == ["o-21"]
        (denied,) = [r for r in read if r.get("status") == "denied"]
        assert "o-22 was never paid" in denied["note"]
        assert [r for r in read if "refund_id" in r] == [{"refund_id": "rf-1"}]
