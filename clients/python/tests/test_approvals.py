"""Approvals through the client, against the real server with an approval policy and an
approver's token (conftest's approval_server): a gated claim awaits a person, Decide is bound to
the fingerprint and to the approver role, the approved call acts once, a denial is replayed, and
the typed outcomes and errors; extend_run and watch_approvals."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from conftest import AGENT_TOKEN, APPROVER_NAME, APPROVER_TOKEN

from idempotency_ledger import (
    AlreadyDecided,
    ApprovalMismatch,
    ApprovalState,
    ApproverRoleRequired,
    AsyncLedger,
    AwaitingApprovalError,
    DeniedError,
    Kind,
    Ledger,
    NotAwaitingApproval,
    Outcome,
    PermissionDenied,
    Status,
)
from idempotency_ledger.testing import LedgerServer

REFUND = {"order": "o-1", "amount": 250}


def test_a_gated_claim_awaits_a_person_and_the_approved_call_acts_once(
        agent_ledger: Ledger, approver: Ledger, run_id: str) -> None:
    asked = agent_ledger.claim(run_id, "issue_refund", REFUND)
    assert asked.outcome == Outcome.AWAITING_APPROVAL and asked.claim_token == ""
    assert asked.entry.status == Status.AWAITING_APPROVAL
    assert asked.approval is not None and asked.approval.state == ApprovalState.REQUESTED
    assert asked.approval.decide_by is not None and "person" in asked.note
    # Under the threshold: not gated.
    small = agent_ledger.claim(run_id, "issue_refund", {"order": "o-1", "amount": 50})
    assert small.outcome == Outcome.CLAIMED
    # The agent's own token cannot decide; another fingerprint changes nothing.
    with pytest.raises(ApproverRoleRequired) as refused:
        agent_ledger.decide(asked.key, asked.fingerprint, "approve", "self-approved")
    assert isinstance(refused.value, PermissionDenied)
    with pytest.raises(ApprovalMismatch):
        approver.decide(asked.key, "0" * 64, "approve", "ok")
    assert agent_ledger.claim(run_id, "issue_refund", REFUND).outcome == Outcome.AWAITING_APPROVAL
    decided = approver.decide(asked.key, asked.fingerprint, "approve", "checked the order")
    assert decided.approval is not None and decided.approval.state == ApprovalState.APPROVED
    assert decided.approval.decided_by == APPROVER_NAME  # from the credential
    assert decided.approval.reason == "checked the order" and decided.approval.execute_by
    assert approver.decide(asked.key, asked.fingerprint, "approve", "again").approval == (
        decided.approval)  # the same decision again changes nothing
    with pytest.raises(AlreadyDecided):
        approver.decide(asked.key, asked.fingerprint, "deny", "changed my mind")
    # Concurrent claims after the approval: one acts.
    effects: list[int] = []
    lock = threading.Lock()

    def refund(attempt: object) -> dict:
        with lock:
            effects.append(1)
        return {"refund_id": "rf-1"}

    outcomes: list[Kind] = []
    threads = [threading.Thread(target=lambda: outcomes.append(agent_ledger.attempt(
        run_id, "issue_refund", REFUND, refund).kind)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(effects) == 1 and outcomes.count(Kind.PERFORMED) == 1
    assert set(outcomes) <= {Kind.PERFORMED, Kind.REPLAYED}
    entry = agent_ledger.lookup(asked.key)
    assert entry.approval is not None and entry.approval.state == ApprovalState.USED
    with pytest.raises(NotAwaitingApproval):  # a call that was never gated
        approver.decide(small.key, small.fingerprint, "approve", "")


def test_a_denial_is_replayed_and_run_once_raises_the_typed_outcomes(
        agent_ledger: Ledger, approver: Ledger, run_id: str) -> None:
    acted: list[int] = []
    with pytest.raises(AwaitingApprovalError) as waiting:
        agent_ledger.run_once(run_id, "delete_account", {"account": "a-1"},
                              lambda attempt: acted.append(1))
    assert waiting.value.for_model() == {"status": "awaiting_approval",
                                         "note": waiting.value.note}
    entry = waiting.value.entry
    approver.decide(entry.key, entry.fingerprint, "deny", "the customer asked to keep it")
    for _ in range(2):
        with pytest.raises(DeniedError) as denied:
            agent_ledger.run_once(run_id, "delete_account", {"account": "a-1"},
                                  lambda attempt: acted.append(1))
        assert "the customer asked to keep it" in denied.value.note
        assert denied.value.approval is not None
        assert denied.value.approval.decided_by == APPROVER_NAME
    assert acted == []
    assert agent_ledger.lookup(entry.key).status == Status.DENIED


def test_require_approval_gates_a_tool_the_policy_does_not(agent_ledger: Ledger,
                                                          approver: Ledger, run_id: str) -> None:
    claimed = agent_ledger.claim(run_id, "send_wire", {"to": "x"}, require_approval=True)
    assert claimed.outcome == Outcome.AWAITING_APPROVAL
    assert agent_ledger.claim(run_id, "send_wire", {"to": "y"}).outcome == Outcome.CLAIMED


def test_a_waiting_repeat_does_not_wait_for_the_decision_in_run_once(
        agent_ledger: Ledger, run_id: str) -> None:
    import time
    started = time.monotonic()
    outcome = agent_ledger.attempt(run_id, "delete_account", {"account": "a-2"},
                                   lambda attempt: None, wait=5)
    again = agent_ledger.attempt(run_id, "delete_account", {"account": "a-2"},
                                 lambda attempt: None, wait=5)
    assert outcome.kind == again.kind == Kind.AWAITING_APPROVAL
    assert time.monotonic() - started < 4


def test_watch_approvals_resumes_from_a_cursor(approval_server: LedgerServer,
                                               run_id: str) -> None:
    async def main() -> None:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as agent, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as person:
            events = person.watch_approvals()
            first = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0.5)  # the stream is open: events from now
            asked = await agent.claim(run_id, "delete_account", {"account": "w-1"})
            requested = await asyncio.wait_for(first, 10)
            assert (requested.kind, requested.entry.key) == ("requested", asked.key)
            assert requested.principal is not None and requested.cursor
            await events.aclose()
            # Decided while nobody watched: resumed from the cursor, nothing is missed.
            await person.decide(asked.key, asked.fingerprint, "approve", "fine")
            resumed = person.watch_approvals(requested.cursor)
            approved = await asyncio.wait_for(anext(resumed), 10)
            assert (approved.kind, approved.entry.key) == ("approved", asked.key)
            assert approved.principal == APPROVER_NAME
            await resumed.aclose()

    asyncio.run(main())
    # The blocking client's iterator, from the start of this run's events.
    with Ledger(approval_server.address, token=APPROVER_TOKEN) as person, \
            Ledger(approval_server.address, token=AGENT_TOKEN) as agent:
        asked = agent.claim(run_id, "delete_account", {"account": "w-2"})
        got: list[str] = []

        def watch() -> None:
            for event in person.watch_approvals():
                if event.entry.key == asked.key:
                    got.append(event.kind)
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        import time
        time.sleep(0.5)
        person.decide(asked.key, asked.fingerprint, "deny", "no")
        watcher.join(10)
        assert got == ["denied"]


def test_extend_run_keeps_a_paused_runs_entries(agent_ledger: Ledger, run_id: str) -> None:
    agent_ledger.run_once(run_id, "send_reply", {"text": "hi"}, lambda a: "sent", retention=60)
    kept = agent_ledger.extend_run(run_id, 7200)
    assert kept.extended == 1 and kept.kept_until is not None
    entry = agent_ledger.lookup(run_id=run_id, tool="send_reply", arguments={"text": "hi"})
    assert entry.expires_at is not None and entry.expires_at >= kept.kept_until
    assert agent_ledger.extend_run(f"{run_id}-none", 60).extended == 0
    assert uuid.UUID(int=0)  # (keeps the import used)
