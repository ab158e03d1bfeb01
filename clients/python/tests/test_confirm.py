"""The paired read, ``confirm=``, on run_once (both clients): an unknown outcome settled right after
it happens and before a repeat answers one, one settlement for any number of callers, strict mode;
against the real server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from scenario import CREDIT, Payments

from idempotency_ledger import (
    AsyncLedger,
    Attempt,
    Confirmation,
    Entry,
    Ledger,
    NotExecuted,
    NotFound,
    OutcomeUnknownError,
    Resolution,
    Status,
    UnknownAttempt,
    cannot_tell,
    found,
    not_found,
)
from idempotency_ledger.testing import LedgerServer

PARITY = json.loads(
    (Path(__file__).resolve().parents[2] / "parity.json").read_text(encoding="utf-8"))


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
    # Completed by the call itself, with its claim token: no Reconcile, so no resolved_by.
    assert (result.entry.status, result.entry.resolved_by) == (Status.SUCCEEDED, "")
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
    assert (entry.status, entry.retryable, entry.resolved_by) == (Status.FAILED, True, "")
    assert entry.error.startswith("the attempt failed (TimeoutError: the payments API did not "
                                  "answer in 5 s) and the tool's paired read found no effect")
    assert "no credit with reference" in entry.error  # the read's own reason, after it
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


# --- what clients/parity.json says of settlements, shown against the real server ---------------


@pytest.mark.parametrize("how", ["raises", "outlives action_timeout"])
def test_while_confirm_is_asked_the_call_keeps_its_claim(server: LedgerServer, run_id: str,
                                                         how: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The call whose action left the outcome unknown keeps its claim while it waits and asks:
    the entry is ATTEMPTING, its lease renewed past its first end (2 s, asked after 2.5 s), and
    a duplicate that arrives meanwhile waits on the claim and reads the settled result."""
    payments = Payments(delay=0)
    release = threading.Event()
    seen: list[Entry] = []
    duplicate: list[Any] = []

    def action(attempt: Attempt) -> dict:
        credit = payments.issue_credit(**CREDIT, reference=attempt.external_ref)
        if how == "raises":
            raise TimeoutError("the payments API did not answer")
        release.wait(20)  # the answer is late: the credit is there, the answer is not
        return credit

    with Ledger(server.address) as ledger, Ledger(server.address) as other:
        def repeat() -> None:
            duplicate.append(other.run_once(run_id, "issue_credit", CREDIT,
                                            lambda a: pytest.fail("acted again"), wait=20))

        def confirm(attempt: UnknownAttempt) -> Confirmation:
            seen.append(ledger.lookup(attempt.key))
            thread = threading.Thread(target=repeat)
            thread.start()
            time.sleep(0.5)  # the duplicate's claim is in, waiting on this one's
            threads.append(thread)
            return payments.confirm(attempt)

        threads: list[threading.Thread] = []
        try:
            with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
                result = ledger.run_once(
                    run_id, "issue_credit", CREDIT, action, lease=2, confirm=confirm,
                    confirm_delay=2.5, action_timeout=0.2 if how != "raises" else None)
        finally:
            release.set()
        for thread in threads:
            thread.join(30)
    (entry,) = seen
    assert entry.status == Status.ATTEMPTING, "confirm is asked under the call's own claim"
    assert entry.lease_expires_at - entry.started_at > timedelta(seconds=2), "lease renewed"
    assert result.confirmed and result.entry.status == Status.SUCCEEDED
    (dup,) = duplicate
    assert dup.replayed and dup.value == result.value and len(payments.credits) == 1
    settled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("settled ")]
    # Completed with the call's own claim token: the entry records no resolved_by, and the log
    # says who settled it as the entry does (settled_by=claimant), never a resolved_by.
    assert result.entry.resolved_by == ""
    assert (f"settled key={result.entry.key} tool=issue_credit "
            f"external_ref={result.entry.external_ref} outcome=found status=SUCCEEDED "
            "settled_by=claimant via=run_once") in settled, settled


def test_the_async_client_keeps_its_claim_while_confirm_is_asked(server: LedgerServer,
                                                                 run_id: str) -> None:
    payments = Payments(delay=0)
    seen: list[Entry] = []

    async def main() -> Any:
        async with AsyncLedger(server.address) as ledger:
            async def confirm(attempt: UnknownAttempt) -> Confirmation:
                seen.append(await ledger.lookup(attempt.key))
                return payments.confirm(attempt)

            async def action(attempt: Attempt) -> dict:
                payments.issue_credit(**CREDIT, reference=attempt.external_ref)
                raise TimeoutError("no answer")

            return await ledger.run_once(run_id, "issue_credit", CREDIT, action, lease=2,
                                         confirm=confirm, confirm_delay=2.5)

    result = asyncio.run(main())
    (entry,) = seen
    assert entry.status == Status.ATTEMPTING
    assert entry.lease_expires_at - entry.started_at > timedelta(seconds=2)
    assert result.confirmed and result.entry.resolved_by == ""


def test_after_cannot_tell_a_repeat_settles_the_entry_at_once(ledger: Ledger,
                                                              run_id: str) -> None:
    """A "cannot tell" leaves the entry UNKNOWN and held by nobody: the next repeat with a
    confirm takes it (Reconcile of its key) and settles it at once, rather than meeting a
    reconcile hold that would lock it out for the server's whole reconcile lease (60 s)."""
    payments = Payments(delay=0)
    down = True

    def confirm(attempt: UnknownAttempt) -> Confirmation:
        if down:
            return cannot_tell("the payments API is down too")
        return payments.confirm(attempt)

    with pytest.raises(TimeoutError):
        ledger.run_once(run_id, "issue_credit", CREDIT, credit_then_time_out(payments),
                        confirm=confirm, confirm_delay=0)
    assert ledger.lookup(run_id=run_id, tool="issue_credit",
                         arguments=CREDIT).status == Status.UNKNOWN
    down = False
    again = ledger.run_once(run_id, "issue_credit", CREDIT, lambda a: pytest.fail("acted again"),
                            confirm=confirm, confirm_delay=0, wait=2)
    assert again.replayed and again.value["credit_id"] == "cr-001"
    assert again.entry.resolved_by == ledger._policy.settler
    assert len(payments.credits) == 1


def test_a_repeat_waits_for_a_settlement_another_caller_is_making(ledger: Ledger,
                                                                  run_id: str) -> None:
    """An UNKNOWN entry held by another settler (here a reconciler: Reconcile of its key) is
    not handed to the repeat; the repeat waits, up to its wait, for what the other finds."""
    claimed = ledger.claim(run_id, "issue_credit", CREDIT)
    ledger.complete(claimed.key, claimed.claim_token, Status.UNKNOWN, error="TimeoutError")
    (held,) = ledger.reconcile(keys=[claimed.key], principal="operator").pending
    assert held.key == claimed.key

    def never(attempt: UnknownAttempt) -> Confirmation:
        raise AssertionError("the entry is someone else's to settle")

    # The operator answers a second later; the repeat (no confirm_delay) asks at once, is not
    # handed the entry, and must wait for that answer.
    settler = threading.Timer(1.0, lambda: ledger.reconcile(
        resolutions=[Resolution.found(held, b'{"credit_id": "cr-9"}')],
        resolve_only=True, principal="operator"))
    settler.start()
    try:
        waited = ledger.run_once(run_id, "issue_credit", CREDIT,
                                 lambda a: pytest.fail("acted again"), confirm=never,
                                 confirm_delay=0, wait=10)
    finally:
        settler.join()
    assert waited.replayed and waited.value == {"credit_id": "cr-9"}
    assert waited.entry.resolved_by == "operator"

    # Nobody settles it within the wait: unknown, after the wait.
    other = ledger.claim(f"{run_id}-2", "issue_credit", CREDIT)
    ledger.complete(other.key, other.claim_token, Status.UNKNOWN, error="TimeoutError")
    ledger.reconcile(keys=[other.key], principal="operator")
    started = time.monotonic()
    with pytest.raises(OutcomeUnknownError):
        ledger.run_once(f"{run_id}-2", "issue_credit", CREDIT,
                        lambda a: pytest.fail("acted again"), confirm=never,
                        confirm_delay=0, wait=0.6)
    assert time.monotonic() - started >= 0.5


def _settled_lines(caplog: pytest.LogCaptureFixture, key: str) -> list[dict[str, str]]:
    """The settlement lines logged about `key`, as their fields (`via` last, the rest of the
    line: "a repeat" is two words)."""
    lines = []
    for record in caplog.records:
        message = record.getMessage()
        if message.startswith(f"settled key={key} "):
            head, _, via = message.partition(" via=")
            lines.append({**dict(f.split("=", 1) for f in head.split()[1:]), "via": via})
    return lines


def test_the_settlement_log_says_who_settled_as_the_entry_does(
        ledger: Ledger, run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    """Each settlement line names a resolved_by only when the entry records one (a Reconcile's
    resolution); a call that settled its own attempt with its claim token says
    settled_by=claimant, and a read that could not tell settled_by=nobody. `via` is one word
    in both clients: run_once."""
    payments = Payments(delay=0)
    down = True

    def confirm(attempt: UnknownAttempt) -> Confirmation:
        return cannot_tell("down") if down else payments.confirm(attempt)

    with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
        found = ledger.run_once(run_id, "issue_credit", CREDIT, credit_then_time_out(payments),
                                confirm=payments.confirm, confirm_delay=0)
        with pytest.raises(NotExecuted):
            ledger.run_once(f"{run_id}-2", "issue_credit", CREDIT, time_out_before_acting,
                            confirm=payments.confirm, confirm_delay=0)
        with pytest.raises(TimeoutError):
            ledger.run_once(f"{run_id}-3", "issue_credit", CREDIT,
                            credit_then_time_out(payments), confirm=confirm, confirm_delay=0)
        down = False
        repeat = ledger.run_once(f"{run_id}-3", "issue_credit", CREDIT,
                                 lambda a: pytest.fail("acted again"), confirm=confirm,
                                 confirm_delay=0, wait=2)
    not_found = ledger.lookup(run_id=f"{run_id}-2", tool="issue_credit", arguments=CREDIT)
    cases = [(found.entry.key, "found", "SUCCEEDED", "run_once"),
             (not_found.key, "not_found", "FAILED", "run_once")]
    for key, outcome, status, via in cases:
        assert ledger.lookup(key).resolved_by == ""
        assert _settled_lines(caplog, key) == [
            {"key": key, "tool": "issue_credit", "external_ref": ledger.lookup(key).external_ref,
             "outcome": outcome, "status": status, "settled_by": "claimant", "via": via}]
    unsure, settled = _settled_lines(caplog, repeat.entry.key)
    assert (unsure["outcome"], unsure["status"], unsure["settled_by"], unsure["via"]) == (
        "cannot_tell", "UNKNOWN", "nobody", "run_once")
    assert "resolved_by" not in unsure
    # The repeat settled it with Reconcile: the entry records who, and the line says the same.
    assert repeat.entry.resolved_by == ledger._policy.settler
    assert (settled["outcome"], settled["status"], settled["resolved_by"], settled["via"]) == (
        "found", "SUCCEEDED", repeat.entry.resolved_by, "a repeat")
    assert "settled_by" not in settled
    assert not any("runOnce" in r.getMessage() for r in caplog.records)


def test_a_repeat_settles_as_the_call_then_the_client_then_confirm_at_host_pid(
        server: LedgerServer, run_id: str) -> None:
    order = PARITY["settlement"]["principal_order"]
    assert order == ["call", "client", "default"]
    default = PARITY["settlement"]["default_principal"]["confirm"].format(
        host=socket.gethostname(), pid=os.getpid())
    payments = Payments(delay=0)
    cases = [("", None, default), ("", "", default), ("agent-7", None, "agent-7"),
             ("agent-7", "", "agent-7"), ("agent-7", "call-1", "call-1")]
    for n, (client_principal, call_principal, expected) in enumerate(cases):
        args = {**CREDIT, "customer": f"c-{n}"}
        with Ledger(server.address, principal=client_principal) as ledger:
            claimed = ledger.claim(run_id, "issue_credit", args)
            payments.issue_credit(**args, reference=claimed.entry.external_ref)
            ledger.complete(claimed.key, claimed.claim_token, Status.UNKNOWN,
                            error="TimeoutError")
            again = ledger.run_once(run_id, "issue_credit", args,
                                    lambda a: pytest.fail("acted again"),
                                    confirm=payments.confirm, confirm_delay=0,
                                    principal=call_principal)
        assert again.replayed and again.entry.resolved_by == expected, (client_principal,
                                                                        call_principal)


def test_strict_mode_refuses_run_once_without_a_confirm_before_claiming(server: LedgerServer,
                                                                        run_id: str) -> None:
    # As the TypeScript client's requireConfirm refuses runOnce and runTool without one.
    with Ledger(server.address, require_confirm=True) as strict:
        with pytest.raises(ValueError, match=r"tool t has no confirm=.*require_confirm=True"):
            strict.run_once(run_id, "t", {}, lambda a: pytest.fail("acted"))
        with pytest.raises(ValueError, match="cannot be safely retried"):
            strict.attempt(run_id, "t", {}, lambda a: pytest.fail("acted"))
        with pytest.raises(NotFound):  # nothing was claimed
            strict.lookup(run_id=run_id, tool="t", arguments={})
        done = strict.run_once(run_id, "t", {}, lambda a: 1, confirm=lambda a: not_found())
        assert done.value == 1
