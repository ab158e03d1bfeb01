"""The paired read, ``confirm=``, on run_once (both clients): an unknown outcome settled right after
it happens and before a repeat answers one, one settlement for any number of callers, strict mode;
against the real server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
from scenario import CREDIT, Payments

from idempotency_ledger import (
    AsyncLedger,
    Attempt,
    Confirmation,
    Ledger,
    NotExecuted,
    OutcomeUnknownError,
    Status,
    UnknownAttempt,
    cannot_tell,
    found,
    not_found,
)
from idempotency_ledger.testing import LedgerServer


def credit_then_time_out(payments: Payments) -> Any:
    """An action whose answer is lost: the credit is issued, then the call times out."""
    def action(attempt: Attempt) -> dict:
        payments.issue_credit(**CREDIT, reference=attempt.external_ref)
        raise TimeoutError("the payments API did not answer in 5 s")

    return action


def time_out_before_acting(attempt: Attempt) -> dict:
    raise TimeoutError("the payments API did not answer in 5 s")  # the request never arrived


def test_an_unknown_outcome_found_by_confirm_returns_the_result_found(ledger: Ledger,
                                                                      run_id: str) -> None:
    payments = Payments(delay=0)
    result = ledger.run_once(run_id, "issue_credit", CREDIT, credit_then_time_out(payments),
                             confirm=payments.confirm, confirm_delay=0)
    (credit,) = payments.credits
    assert result.value == {"credit_id": credit["credit_id"], "amount": 200, "currency": "EUR"}
    assert (result.replayed, result.confirmed) == (False, True)
    assert (result.entry.status, result.entry.resolved_by) == (Status.SUCCEEDED,
                                                               ledger._policy.settler)
    (asked,) = payments.confirmed
    assert (asked.key, asked.external_ref, asked.arguments, asked.number, asked.tool) == (
        result.entry.key, credit["reference"], CREDIT, 1, "issue_credit")
    # Repeats replay what was found; nothing acts again.
    again = ledger.run_once(run_id, "issue_credit", CREDIT, credit_then_time_out(payments))
    assert again.replayed and again.value == result.value and len(payments.credits) == 1


def test_an_unknown_outcome_confirm_finds_did_not_happen_is_retryable(ledger: Ledger,
                                                                      run_id: str) -> None:
    payments = Payments(delay=0)
    with pytest.raises(NotExecuted) as nothing:
        ledger.run_once(run_id, "issue_credit", CREDIT, time_out_before_acting,
                        confirm=payments.confirm, confirm_delay=0)
    assert isinstance(nothing.value.__cause__, TimeoutError)
    entry = nothing.value.entry
    assert (entry.status, entry.retryable, entry.resolved_by) == (Status.FAILED, True,
                                                                  ledger._policy.settler)
    assert "no credit with reference" in entry.error
    # The next call acts, once.
    done = ledger.run_once(run_id, "issue_credit", CREDIT,
                           lambda a: payments.issue_credit(**CREDIT, reference=a.external_ref))
    assert (done.replayed, done.entry.attempt, len(payments.credits)) == (False, 2, 1)


def test_when_confirm_cannot_tell_the_outcome_stays_unknown(ledger: Ledger, run_id: str,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    asked: list[UnknownAttempt] = []

    def cannot(attempt: UnknownAttempt) -> Confirmation:
        asked.append(attempt)
        return cannot_tell("the payments API is down too")

    with caplog.at_level(logging.INFO, logger="idempotency_ledger"), pytest.raises(TimeoutError):
        ledger.run_once(run_id, "issue_credit", CREDIT, time_out_before_acting, confirm=cannot,
                        confirm_delay=0)
    entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
    assert entry.status == Status.UNKNOWN and len(asked) == 1
    assert "outcome=cannot_tell" in caplog.text and f"key={entry.key}" in caplog.text


@pytest.mark.parametrize("answer", ["raises", "returns junk"])
def test_a_confirm_that_fails_is_read_as_cannot_tell(ledger: Ledger, run_id: str,
                                                     answer: str) -> None:
    def broken(attempt: UnknownAttempt) -> Any:
        if answer == "raises":
            raise ConnectionError("the read itself failed")
        return {"found": True}  # not one of found(), not_found(), cannot_tell()

    with pytest.raises(TimeoutError):
        ledger.run_once(run_id, "t", {}, time_out_before_acting, confirm=broken,
                        confirm_delay=0)
    assert ledger.lookup(run_id=run_id, tool="t", arguments={}).status == Status.UNKNOWN


def test_an_action_timeout_is_settled_by_confirm_too(ledger: Ledger, run_id: str) -> None:
    payments = Payments(delay=0)
    release = threading.Event()

    def slow(attempt: Attempt) -> dict:
        credit = payments.issue_credit(**CREDIT, reference=attempt.external_ref)
        release.wait(10)  # the answer is late: the credit is there, the answer is not
        return credit

    try:
        result = ledger.run_once(run_id, "issue_credit", CREDIT, slow, action_timeout=0.2,
                                 confirm=payments.confirm, confirm_delay=0)
    finally:
        release.set()
    assert result.confirmed and result.value["credit_id"] == "cr-001"
    assert result.entry.status == Status.SUCCEEDED


def test_a_repeat_meeting_an_unknown_outcome_settles_it_first(server: LedgerServer,
                                                              run_id: str) -> None:
    payments = Payments(delay=0)
    args_found = {**CREDIT, "customer": "c-1"}
    args_absent = {**CREDIT, "customer": "c-2"}
    with Ledger(server.address) as first, Ledger(server.address) as second:
        # A claimant that crashed: one after the credit went through, one before it did; their
        # leases end without a Complete.
        for args, credited in ((args_found, True), (args_absent, False)):
            claimed = first.claim(run_id, "issue_credit", args, lease=1)
            if credited:
                payments.issue_credit(**args, reference=claimed.entry.external_ref)
        time.sleep(1.5)
        assert first.lookup(claimed.key).status == Status.UNKNOWN

        def credit(attempt: Attempt) -> dict:
            return payments.issue_credit(**args_absent, reference=attempt.external_ref)

        # Found: the repeat replays what was found, without acting.
        replayed = second.run_once(run_id, "issue_credit", args_found,
                                   lambda a: pytest.fail("acted again"),
                                   confirm=payments.confirm)
        assert replayed.replayed and replayed.value["credit_id"] == "cr-001"
        # Not found: the repeat acts now, once (attempt 2).
        acted = second.run_once(run_id, "issue_credit", args_absent, credit,
                                confirm=payments.confirm)
        assert (acted.replayed, acted.entry.attempt, acted.value["credit_id"]) == (False, 2,
                                                                                   "cr-002")
        assert len(payments.credits) == 2 and len(payments.confirmed) == 2


def test_one_settlement_wins_across_callers(server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    asked: list[str] = []
    gate = threading.Event()

    def slow_confirm(attempt: UnknownAttempt) -> Confirmation:
        asked.append(attempt.key)
        gate.wait(10)  # every other caller arrives while this one is asking
        return payments.confirm(attempt)

    with Ledger(server.address) as ledger:
        claimed = ledger.claim(run_id, "issue_credit", CREDIT)
        payments.issue_credit(**CREDIT, reference=claimed.entry.external_ref)
        ledger.complete(claimed.key, claimed.claim_token, Status.UNKNOWN, error="TimeoutError")

        results: list[Any] = []

        def repeat() -> None:
            with Ledger(server.address) as client:  # each its own channel, as separate servers
                results.append(client.run_once(run_id, "issue_credit", CREDIT,
                                               lambda a: pytest.fail("acted again"),
                                               confirm=slow_confirm))

        threads = [threading.Thread(target=repeat) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while not asked and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # the others meet the entry held by the first
        gate.set()
        for t in threads:
            t.join(20)
    assert asked == [claimed.key]  # one confirm, for every caller
    assert len(results) == 4 and all(r.replayed and r.value["credit_id"] == "cr-001"
                                     for r in results)
    assert len(payments.credits) == 1


def test_the_async_client_settles_with_a_coroutine_confirm(server: LedgerServer,
                                                           run_id: str) -> None:
    payments = Payments(delay=0)

    async def confirm(attempt: UnknownAttempt) -> Confirmation:
        await asyncio.sleep(0)
        credit = payments.find(attempt.external_ref)
        return found(credit) if credit else not_found()

    async def credit_then_time_out_async(attempt: Attempt) -> dict:
        payments.issue_credit(**CREDIT, reference=attempt.external_ref)
        raise TimeoutError("no answer")

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            result = await ledger.run_once(run_id, "issue_credit", CREDIT,
                                           credit_then_time_out_async, confirm=confirm,
                                           confirm_delay=0)
            assert result.confirmed and result.entry.status == Status.SUCCEEDED
            with pytest.raises(NotExecuted):
                await ledger.run_once(f"{run_id}-2", "issue_credit", CREDIT,
                                      time_out_before_acting, confirm=confirm, confirm_delay=0)
            # Without confirm the outcome stays unknown, and so does every repeat's.
            with pytest.raises(TimeoutError):
                await ledger.run_once(f"{run_id}-3", "issue_credit", CREDIT,
                                      time_out_before_acting)
            with pytest.raises(OutcomeUnknownError):
                await ledger.run_once(f"{run_id}-3", "issue_credit", CREDIT,
                                      time_out_before_acting)

    asyncio.run(main())
    assert len(payments.credits) == 1


def test_not_executed_classes_and_causes_are_retryable(ledger: Ledger, run_id: str) -> None:
    class Refused(Exception):
        pass

    def refuses(attempt: Attempt) -> None:
        raise Refused("429")

    def wrapped(attempt: Attempt) -> None:
        raise RuntimeError("the framework's retry") from NotExecuted("nothing was sent")

    with pytest.raises(Refused):
        ledger.run_once(run_id, "a", {}, refuses, not_executed=(Refused,))
    with pytest.raises(RuntimeError):
        ledger.run_once(run_id, "b", {}, wrapped)
    for tool in ("a", "b"):
        entry = ledger.lookup(run_id=run_id, tool=tool, arguments={})
        assert (entry.status, entry.retryable) == (Status.FAILED, True)
