"""Fenced findings (issue 27), against the real server: every resolution the client sends names
the attempt it read and the hold token it was handed, so a late finding changes nothing and is
reported for what it is (stale, already resolved), never as settled by us; a repeat inside the
server's reconcile grace is not handed the entry and waits; and a read that finds nothing while
the action may still land leaves the outcome unknown."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from scenario import CREDIT, Payments

from idempotency_ledger import (
    ActionTimeout,
    AsyncLedger,
    Attempt,
    Confirmation,
    Entry,
    InvalidArgument,
    Ledger,
    OutcomeUnknownError,
    Reconciler,
    Resolution,
    ResolutionOutcome,
    Status,
    UnknownAttempt,
    found,
    not_found,
)
from idempotency_ledger._proto import ledger_pb2 as pb
from idempotency_ledger.errors import error_from_rpc
from idempotency_ledger.testing import LedgerServer

#: A reconciler's hold on what Reconcile handed it, on the servers of these tests.
HOLD = 1.0


@pytest.fixture
def short_holds(ledger_bin: Path, tmp_path: Path) -> Iterator[LedgerServer]:
    """A server whose reconcile holds last a second, so that a slow read outlives its hold."""
    server = LedgerServer(ledger_bin, directory=tmp_path / "ledger",
                          args=["--reconcile-lease", f"{HOLD:g}s"]).start()
    try:
        yield server
    finally:
        server.stop()


def unknown(ledger: Ledger, run_id: str, args: dict = CREDIT) -> Entry:
    """An issue_credit entry whose claimant reported its outcome unknown."""
    claimed = ledger.claim(run_id, "issue_credit", args)
    return ledger.complete(claimed.key, claimed.claim_token, Status.UNKNOWN,
                           error="TimeoutError").entry


def unapplied(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"finding not applied key={key} ")]


# --- the resolution names its attempt and hold ------------------------------------------------


def test_a_resolution_without_attempt_and_hold_token_is_refused_before_it_is_sent(
        server: LedgerServer, run_id: str) -> None:
    with Ledger(server.address) as ledger:
        entry = unknown(ledger, run_id)
        bare = Resolution(entry.key, Status.SUCCEEDED, result=b'"done"')
        with pytest.raises(InvalidArgument) as refused:
            ledger.reconcile(resolutions=[bare], resolve_only=True)
        # The client's refusal is the server's, class, reason and field alike.
        assert (refused.value.reason, refused.value.field) == ("UNFENCED_RESOLUTION",
                                                              "resolutions")
        assert "copy both from the pending entry" in refused.value.message
        with pytest.raises(grpc.RpcError) as sent_anyway:
            ledger._stub.Reconcile(pb.ReconcileRequest(  # noqa: SLF001 (what the client refuses)
                resolutions=[pb.Resolution(key=entry.key, status="STATUS_SUCCEEDED")],
                resolve_only=True))
        server_says = error_from_rpc(sent_anyway.value)
        assert type(server_says) is InvalidArgument
        assert (server_says.reason, server_says.field) == ("UNFENCED_RESOLUTION", "resolutions")
        assert ledger.lookup(entry.key).status == Status.UNKNOWN  # nothing changed
        with pytest.raises(TypeError, match="made from the pending Entry"):
            Resolution.found(entry.key, b'"done"')  # type: ignore[arg-type]


def test_a_hand_out_carries_the_attempt_and_a_new_hold_token_each_time(
        short_holds: LedgerServer, run_id: str) -> None:
    with Ledger(short_holds.address) as ledger:
        entry = unknown(ledger, run_id)
        (first,) = ledger.reconcile(keys=[entry.key]).pending
        time.sleep(HOLD + 0.3)
        (second,) = ledger.reconcile(keys=[entry.key]).pending
        assert (first.attempt, second.attempt) == (1, 1)
        assert first.hold_token and second.hold_token and first.hold_token != second.hold_token
        assert ledger.lookup(entry.key).hold_token == ""  # set on hand-outs only
        stale, = ledger.reconcile(resolutions=[Resolution.found(first, b'"a"')]).results
        assert (stale.result, stale.applied, stale.entry.status) == (
            ResolutionOutcome.STALE, False, Status.UNKNOWN)
        assert stale.note
        applied, = ledger.reconcile(resolutions=[Resolution.found(second, b'"b"')]).results
        assert (applied.result, applied.entry.status) == (ResolutionOutcome.APPLIED,
                                                          Status.SUCCEEDED)


# --- the Reconciler ---------------------------------------------------------------------------


def test_a_reconcilers_finding_after_its_hold_went_to_another_is_stale_and_changes_nothing(
        short_holds: LedgerServer, run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    payments = Payments(delay=0)
    with Ledger(short_holds.address) as ledger:
        entry = unknown(ledger, run_id)
        payments.issue_credit(**CREDIT, reference=entry.external_ref)
        others: list[Entry] = []

        def slow_read(attempt: UnknownAttempt) -> Confirmation:
            time.sleep(HOLD + 0.3)  # this reconciler's hold ends while it reads ...
            others.extend(ledger.reconcile(keys=[attempt.key], principal="reconciler-b").pending)
            return payments.confirm(attempt)  # ... and another took the entry meanwhile

        reconciler = Reconciler(ledger, {"issue_credit": slow_read}, older_than=0,
                                principal="reconciler-a")
        with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
            (settled,) = reconciler.run_round()
        assert (settled.outcome, settled.status, settled.who, settled.attempt,
                settled.attempt_now) == ("stale", Status.UNKNOWN, "", 1, 1)
        assert reconciler.counts == {"stale": 1}  # counted, never as settled
        now = ledger.lookup(entry.key)
        assert (now.status, now.resolved_by) == (Status.UNKNOWN, "")
        (line,) = unapplied(caplog, entry.key)
        # The TypeScript client's words (clients/typescript/src/settle.ts, logNotApplied).
        assert line.startswith(
            f"finding not applied key={entry.key} tool=issue_credit "
            f"external_ref={entry.external_ref} finding=found result=STALE attempt_seen=1 "
            "attempt_now=1 status_now=UNKNOWN settled_by=nobody via=reconciler: ")
        assert not any(r.getMessage().startswith(f"settled key={entry.key}")
                       for r in caplog.records)
        # The other holder's finding is current: it settles.
        (held,) = others
        done = ledger.reconcile(resolutions=[Resolution.found(held, b'{"credit_id":"cr-001"}')],
                                resolve_only=True, principal="reconciler-b")
        assert done.results[0].applied
        assert ledger.lookup(entry.key).resolved_by == "reconciler-b"


def test_a_hold_that_ended_and_nobody_replaced_still_settles(short_holds: LedgerServer,
                                                             run_id: str) -> None:
    payments = Payments(delay=0)
    with Ledger(short_holds.address) as ledger:
        entry = unknown(ledger, run_id)

        def slow_read(attempt: UnknownAttempt) -> Confirmation:
            time.sleep(HOLD + 0.3)  # the hold ends; nobody takes the entry meanwhile
            return payments.confirm(attempt)

        reconciler = Reconciler(ledger, {"issue_credit": slow_read}, older_than=0,
                                principal="reconciler-a")
        (settled,) = reconciler.run_round()
        assert (settled.outcome, settled.status, settled.who) == ("not_found", Status.FAILED,
                                                                  "reconciler-a")
        assert reconciler.counts == {"not_found": 1}
        assert ledger.lookup(entry.key).resolved_by == "reconciler-a"


@pytest.mark.parametrize("late_read", ["not_found", "found"])
def test_a_late_finding_about_an_earlier_attempt_never_settles_the_next(
        short_holds: LedgerServer, run_id: str, late_read: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 27's story: reconciler A takes attempt 1 and stalls; B takes it after A's hold,
    finds nothing, resolves it FAILED retryable; the agent acts again (attempt 2), and attempt 2
    ends unknown too; A's late finding about attempt 1 is stale, and the entry stays unknown at
    attempt 2. A late "found" (attempt 1 did act) marks the entry as a possible double effect."""
    payments = Payments(delay=0)
    with Ledger(short_holds.address) as ledger:
        entry = unknown(ledger, run_id)

        def stalled_read(attempt: UnknownAttempt) -> Confirmation:
            time.sleep(HOLD + 0.3)
            (b,) = ledger.reconcile(keys=[attempt.key], principal="reconciler-b").pending
            ledger.reconcile(resolutions=[Resolution.not_found(b, "no credit")],
                             resolve_only=True, principal="reconciler-b")
            second = ledger.claim(run_id, "issue_credit", CREDIT)
            assert second.entry.attempt == 2
            payments.issue_credit(**CREDIT, reference=second.entry.external_ref)
            ledger.complete(second.key, second.claim_token, Status.UNKNOWN, error="lost")
            return found({"credit_id": "cr-001"}) if late_read == "found" else not_found()

        reconciler = Reconciler(ledger, {"issue_credit": stalled_read}, older_than=0,
                                principal="reconciler-a")
        with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
            (settled,) = reconciler.run_round()
        assert (settled.outcome, settled.attempt, settled.attempt_now, settled.status) == (
            "stale", 1, 2, Status.UNKNOWN)
        now = ledger.lookup(entry.key)
        assert (now.status, now.attempt, now.resolved_by) == (Status.UNKNOWN, 2, "")
        assert now.possible_double_effect is (late_read == "found")
        (line,) = unapplied(caplog, entry.key)
        assert (f"finding={late_read} result=STALE attempt_seen=1 attempt_now=2 "
                "status_now=UNKNOWN settled_by=nobody via=reconciler") in line
        alarms = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
                  and r.getMessage().startswith(f"possible double effect key={entry.key} ")]
        assert len(alarms) == (late_read == "found")


# --- a repeat's settlement --------------------------------------------------------------------


def test_a_repeats_finding_after_its_hold_went_to_another_is_stale_and_it_waits_for_theirs(
        short_holds: LedgerServer, run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    with Ledger(short_holds.address) as ledger:
        entry = unknown(ledger, run_id)
        timers: list[threading.Timer] = []

        def slow_read(attempt: UnknownAttempt) -> Confirmation:
            time.sleep(HOLD + 0.3)  # the repeat's hold ends while it reads
            (held,) = ledger.reconcile(keys=[attempt.key], principal="operator").pending
            timer = threading.Timer(0.5, lambda: ledger.reconcile(
                resolutions=[Resolution.found(held, b'{"credit_id":"cr-9"}')],
                resolve_only=True, principal="operator"))
            timer.start()
            timers.append(timer)
            return found({"credit_id": "cr-mine"})

        with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
            result = ledger.run_once(run_id, "issue_credit", CREDIT,
                                     lambda a: pytest.fail("acted again"), confirm=slow_read,
                                     confirm_delay=0, wait=10)
        for timer in timers:
            timer.join()
    assert result.replayed and result.value == {"credit_id": "cr-9"}
    assert result.entry.resolved_by == "operator"
    (line,) = unapplied(caplog, entry.key)
    assert ("finding=found result=STALE attempt_seen=1 attempt_now=1 status_now=UNKNOWN "
            "settled_by=nobody via=a repeat: ") in line


def test_a_repeat_inside_the_reconcile_grace_is_not_handed_the_entry_and_waits(
        ledger_bin: Path, tmp_path: Path, run_id: str) -> None:
    grace = 3.0
    asked: list[UnknownAttempt] = []

    def read(attempt: UnknownAttempt) -> Confirmation:
        asked.append(attempt)
        return found({"credit_id": "cr-1"})

    with LedgerServer(ledger_bin, directory=tmp_path / "ledger",
                      args=["--reconcile-grace", f"{grace:g}s"]) as graced, \
            Ledger(graced.address) as ledger:
        entry = unknown(ledger, run_id)
        reported = time.monotonic()
        assert ledger.reconcile(keys=[entry.key]).pending == []  # not yet handed out
        with pytest.raises(OutcomeUnknownError):
            ledger.run_once(run_id, "issue_credit", CREDIT, lambda a: pytest.fail("acted"),
                            confirm=read, confirm_delay=0, wait=1)
        assert asked == [] and time.monotonic() - reported >= 1.0  # it waited, did not ask
        time.sleep(max(0.0, grace + 0.3 - (time.monotonic() - reported)))
        result = ledger.run_once(run_id, "issue_credit", CREDIT, lambda a: pytest.fail("acted"),
                                 confirm=read, confirm_delay=0, wait=1)
    assert result.replayed and result.value == {"credit_id": "cr-1"} and len(asked) == 1


def test_a_test_server_hands_unknown_outcomes_out_at_once_unless_told(
        ledger_bin: Path, tmp_path: Path, run_id: str) -> None:
    for grace, handed_out in (("0s", True), (None, False)):
        with LedgerServer(ledger_bin, directory=tmp_path / f"ledger-{grace}",
                          reconcile_grace=grace) as server, Ledger(server.address) as ledger:
            entry = unknown(ledger, run_id)
            assert bool(ledger.reconcile(keys=[entry.key]).pending) is handed_out, grace


# --- this call's own read, while the action may still land ------------------------------------


def test_nothing_found_after_an_action_timeout_leaves_the_outcome_unknown(
        ledger: Ledger, run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    payments = Payments(delay=0)
    release = threading.Event()
    landed = threading.Event()

    def slow(attempt: Attempt) -> dict:
        release.wait(10)  # still on its way when the read looks
        credit = payments.issue_credit(**CREDIT, reference=attempt.external_ref)
        landed.set()
        return credit

    with caplog.at_level(logging.INFO, logger="idempotency_ledger"), \
            pytest.raises(ActionTimeout) as timed_out:
        ledger.run_once(run_id, "issue_credit", CREDIT, slow, action_timeout=0.2,
                        confirm=payments.confirm, confirm_delay=0)
    entry = timed_out.value.entry
    assert (entry.status, entry.retryable) == (Status.UNKNOWN, False)
    assert "the action may still be running or landing" in entry.error
    assert (f"settled key={entry.key} tool=issue_credit external_ref={entry.external_ref} "
            "outcome=not_found status=UNKNOWN settled_by=nobody via=run_once") in caplog.text
    # Rightly: the credit lands after all, and the late answer settles the entry.
    release.set()
    assert landed.wait(10)
    deadline = time.monotonic() + 10
    while ledger.lookup(entry.key).status == Status.UNKNOWN:
        assert time.monotonic() < deadline, "the late answer was not recorded"
        time.sleep(0.05)
    again = ledger.run_once(run_id, "issue_credit", CREDIT, lambda a: pytest.fail("acted"))
    assert again.replayed and len(payments.credits) == 1


def test_nothing_found_after_the_async_action_was_cancelled_leaves_the_outcome_unknown(
        server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)

    async def main() -> Any:
        async with AsyncLedger(server.address) as ledger:
            async def slow(attempt: Attempt) -> dict:
                await asyncio.sleep(30)
                return {}

            with pytest.raises(ActionTimeout) as timed_out:
                await ledger.run_once(run_id, "issue_credit", CREDIT, slow, action_timeout=0.2,
                                      confirm=payments.confirm, confirm_delay=0)
            return timed_out.value.entry

    entry = asyncio.run(main())
    assert entry.status == Status.UNKNOWN and len(payments.confirmed) == 1

