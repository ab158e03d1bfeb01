"""run_once through the blocking client, against the real server."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from idempotency_ledger import (
    BYTES,
    ActionTimeout,
    Attempt,
    InProgressError,
    InvalidArgument,
    KeyReused,
    Ledger,
    LedgerError,
    NotExecuted,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    Result,
    ResultNotEncodable,
    Status,
)
from idempotency_ledger.testing import LedgerServer

ARGS = {"customer": "c-42", "amount": 200, "currency": "EUR"}
# The same intent as ARGS, as a model might spell it.
ARGS_REORDERED = '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}'


class Tool:
    """A fake side-effecting tool that counts its calls."""

    def __init__(self, result: object = None, error: BaseException | None = None) -> None:
        self.calls: list[Attempt] = []
        self.result = result if result is not None else {"credit_id": "cr-981"}
        self.error = error

    def __call__(self, attempt: Attempt) -> object:
        self.calls.append(attempt)
        if self.error is not None:
            raise self.error
        return self.result


def test_the_first_call_runs_the_action_and_stores_its_result(ledger: Ledger,
                                                               run_id: str) -> None:
    tool = Tool()
    result = ledger.run_once(run_id, "issue_credit", ARGS, tool)
    assert (result.value, result.replayed, result.note) == ({"credit_id": "cr-981"}, False, "")
    assert result.entry.status == Status.SUCCEEDED and result.entry.attempt == 1
    assert len(tool.calls) == 1
    assert tool.calls[0].external_ref == result.entry.external_ref
    stored = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=ARGS)
    assert stored.result == b'{"credit_id":"cr-981"}'


def test_a_repeat_with_reordered_arguments_replays_without_running(ledger: Ledger,
                                                                   run_id: str) -> None:
    tool = Tool()
    first = ledger.run_once(run_id, "issue_credit", ARGS, tool)
    again = ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool)
    assert len(tool.calls) == 1
    assert again.replayed and again.value == first.value
    assert again.note == ("This action was already performed in this run; returning the earlier "
                          "result. No new action was taken.")
    assert again.entry.key == first.entry.key and again.entry.replay_count == 1


def test_a_new_run_is_a_new_intent_and_runs_again(ledger: Ledger, run_id: str) -> None:
    tool = Tool()
    first = ledger.run_once(run_id, "issue_credit", ARGS, tool)
    second = ledger.run_once(run_id + "-new", "issue_credit", ARGS_REORDERED, tool)
    assert len(tool.calls) == 2
    assert not first.replayed and not second.replayed
    assert first.entry.key != second.entry.key


def _run_in_background(ledger: Ledger, run_id: str, action,
                       **options) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(ledger.run_once(run_id, "issue_credit", ARGS, action, **options))
        except BaseException as e:  # noqa: BLE001  (handed to the test)
            outcome.append(e)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, outcome


def test_a_second_call_while_the_first_runs_is_in_progress(ledger: Ledger, run_id: str) -> None:
    started, release = threading.Event(), threading.Event()
    tool = Tool()

    def slow(attempt: Attempt) -> object:
        started.set()
        release.wait(10)
        return tool(attempt)

    thread, outcome = _run_in_background(ledger, run_id, slow)
    try:
        assert started.wait(10)
        with pytest.raises(InProgressError) as in_progress:
            ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool, wait=0)
        assert not isinstance(in_progress.value, OutcomeUnknownError)
        assert in_progress.value.entry.status == Status.ATTEMPTING
        assert in_progress.value.retry_after is not None and in_progress.value.retry_after > 0
        assert in_progress.value.note
    finally:
        release.set()
        thread.join(10)
    assert len(tool.calls) == 1 and not outcome[0].replayed


def test_a_second_call_waits_for_the_first_and_replays_its_result(ledger: Ledger,
                                                                  run_id: str) -> None:
    started = threading.Event()
    tool = Tool()

    def slow(attempt: Attempt) -> object:
        started.set()
        time.sleep(0.5)
        return tool(attempt)

    thread, outcome = _run_in_background(ledger, run_id, slow)
    assert started.wait(10)
    waited = ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool, wait=5)
    thread.join(10)
    assert len(tool.calls) == 1
    assert waited.replayed and waited.value == outcome[0].value


def test_a_waiter_gets_the_claim_when_the_first_attempt_fails_retryably(ledger: Ledger,
                                                                        run_id: str) -> None:
    started = threading.Event()

    def refused(attempt: Attempt) -> object:
        started.set()
        time.sleep(0.3)
        raise NotExecuted("429: rate limited before acting")

    thread, outcome = _run_in_background(ledger, run_id, refused)
    assert started.wait(10)
    tool = Tool()
    result = ledger.run_once(run_id, "issue_credit", ARGS, tool, wait=5)
    thread.join(10)
    assert isinstance(outcome[0], NotExecuted)
    assert len(tool.calls) == 1 and tool.calls[0].number == 2
    assert not result.replayed and result.entry.attempt == 2


def test_a_retryable_failure_lets_the_next_call_run_again(ledger: Ledger, run_id: str) -> None:
    with pytest.raises(NotExecuted) as failed:
        ledger.run_once(run_id, "issue_credit", ARGS, Tool(error=NotExecuted("429: try later")))
    entry = failed.value.entry
    assert entry is not None
    assert (entry.status, entry.retryable) == (Status.FAILED, True)
    assert entry.error == "NotExecuted: 429: try later"
    tool = Tool()
    result = ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool)
    assert len(tool.calls) == 1 and result.entry.attempt == 2 and not result.replayed


def test_a_permanent_failure_is_returned_to_every_repeat(ledger: Ledger, run_id: str) -> None:
    with pytest.raises(PermanentFailure) as failed:
        ledger.run_once(run_id, "issue_credit", ARGS, Tool(error=PermanentFailure("no customer")))
    assert failed.value.entry is not None
    assert (failed.value.entry.status, failed.value.entry.retryable) == (Status.FAILED, False)
    tool = Tool()
    with pytest.raises(PreviouslyFailedError) as previously:
        ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool)
    assert not tool.calls
    assert previously.value.error == "PermanentFailure: no customer"
    assert previously.value.note and previously.value.reason == "PREVIOUSLY_FAILED"
    # The server's note quotes the stored error; the message says it once.
    assert str(previously.value) == f"[PREVIOUSLY_FAILED] {previously.value.note}"
    assert str(previously.value).count("no customer") == 1
    # And what the model reads says it once too.
    assert json.dumps(previously.value.for_model()).count("no customer") == 1


def test_a_timeout_completes_unknown_and_is_never_rerun(ledger: Ledger, run_id: str) -> None:
    with pytest.raises(TimeoutError):
        ledger.run_once(run_id, "issue_credit", ARGS, Tool(error=TimeoutError("no answer in 5s")))
    entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=ARGS)
    assert entry.status == Status.UNKNOWN
    assert entry.error == "TimeoutError: no answer in 5s"
    tool = Tool()
    with pytest.raises(OutcomeUnknownError) as unknown:
        ledger.run_once(run_id, "issue_credit", ARGS, tool, wait=1)
    assert not tool.calls
    assert isinstance(unknown.value, InProgressError)
    assert unknown.value.entry.status == Status.UNKNOWN and unknown.value.retry_after


def test_any_other_error_completes_unknown(ledger: Ledger, run_id: str) -> None:
    with pytest.raises(ConnectionResetError):
        ledger.run_once(run_id, "send_reply", {"n": 1}, Tool(error=ConnectionResetError("reset")))
    assert ledger.lookup(run_id=run_id, tool="send_reply",
                         arguments={"n": 1}).status == Status.UNKNOWN


def test_an_unencodable_result_is_unknown_and_says_how_to_settle_it(ledger: Ledger,
                                                                     run_id: str) -> None:
    tool = Tool(result={"at": object()})
    with pytest.raises(ResultNotEncodable) as unencodable:
        ledger.run_once(run_id, "send_reply", {"n": 2}, tool)
    e = unencodable.value
    assert isinstance(e, OutcomeUnknownError) and isinstance(e.__cause__, TypeError)
    entry = ledger.lookup(run_id=run_id, tool="send_reply", arguments={"n": 2})
    assert entry.status == Status.UNKNOWN and entry.error.startswith("ResultNotEncodable")
    assert e.entry is not None and e.entry.key == e.key == entry.key
    assert "UNKNOWN" in str(e) and "Reconcile" in str(e) and "idempotency-ledger resolve" in str(e)
    assert entry.key in str(e)
    # The action ran, so it is not run again.
    with pytest.raises(OutcomeUnknownError):
        ledger.run_once(run_id, "send_reply", {"n": 2}, tool, wait=0)
    assert len(tool.calls) == 1


def test_an_action_that_cannot_take_the_attempt_is_retryable_not_unknown(ledger: Ledger,
                                                                         run_id: str) -> None:
    with pytest.raises(TypeError, match="one argument"):
        ledger.run_once(run_id, "t", {}, lambda: {"never": "called"})  # type: ignore[arg-type]
    entry = ledger.lookup(run_id=run_id, tool="t", arguments={})
    assert (entry.status, entry.retryable) == (Status.FAILED, True)
    assert entry.error.startswith("TypeError")
    result = ledger.run_once(run_id, "t", {}, lambda attempt: attempt.number)
    assert (result.value, result.entry.attempt) == (2, 2)


def test_action_failures_are_ledger_errors_carrying_the_entry(ledger: Ledger,
                                                              run_id: str) -> None:
    for n, error in enumerate((NotExecuted("429"), PermanentFailure("gone"))):
        with pytest.raises(LedgerError) as failed:
            ledger.run_once(run_id, "t", {"n": n}, Tool(error=error))
        assert failed.value is error and error.entry is not None
        assert error.entry.status == Status.FAILED and error.entry.attempt == 1


def test_a_result_value_is_typed_by_the_action(ledger: Ledger, run_id: str) -> None:
    result: Result[int] = ledger.run_once(run_id, "t", {}, lambda attempt: 41 + attempt.number)
    assert result.value == 42
    assert result.for_model() == 42  # a first run: the value itself
    again = ledger.run_once(run_id, "t", {}, lambda attempt: 0)
    assert again.for_model() == {"status": "already_done", "note": again.note, "result": 42}


def test_an_action_that_outlives_its_timeout_is_unknown_then_completed_late(
        ledger: Ledger, run_id: str) -> None:
    release = threading.Event()
    tool = Tool()

    def slow(attempt: Attempt) -> object:
        release.wait(30)
        return tool(attempt)

    started = time.monotonic()
    with pytest.raises(ActionTimeout) as timed_out:
        ledger.run_once(run_id, "issue_credit", ARGS, slow, action_timeout=0.3)
    assert time.monotonic() - started < 5  # it did not wait for the action
    e = timed_out.value
    assert isinstance(e, OutcomeUnknownError) and e.timeout == 0.3
    assert e.entry is not None and e.entry.status == Status.UNKNOWN
    assert e.entry.error == "ActionTimeout: the action did not finish within 0.3 s"
    assert e.for_model()["status"] == "outcome_unknown"
    # Never run again while unknown.
    with pytest.raises(OutcomeUnknownError):
        ledger.run_once(run_id, "issue_credit", ARGS, tool, wait=0)
    # The action finishes after all: its own Complete settles the entry.
    release.set()
    deadline = time.monotonic() + 10
    while ledger.lookup(e.entry.key).status == Status.UNKNOWN and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ledger.lookup(e.entry.key).status == Status.SUCCEEDED
    assert ledger.run_once(run_id, "issue_credit", ARGS, tool).replayed
    assert len(tool.calls) == 1


def test_an_action_within_its_timeout_returns_its_result_and_sees_the_callers_context(
        ledger: Ledger, run_id: str) -> None:
    from idempotency_ledger import current_run_id, run_scope

    def action(attempt: Attempt) -> object:
        # Runs in a thread of its own (so that it can be abandoned), with the caller's context.
        return {"scope": current_run_id(), "thread": threading.current_thread().name,
                "n": attempt.number}

    with run_scope("outer-scope"):
        result = ledger.run_once(run_id, "t", {}, action, action_timeout=5)
    assert result.value["scope"] == "outer-scope" and result.value["n"] == 1
    assert result.value["thread"].startswith("ledger-action-")


def test_a_slow_action_keeps_its_lease_so_a_duplicate_is_in_progress_not_unknown(
        ledger: Ledger, run_id: str) -> None:
    """Lease 1 s, action 3 s: the lease is renewed every third of it while the action runs."""
    started, release = threading.Event(), threading.Event()
    tool = Tool()

    def slow(attempt: Attempt) -> object:
        started.set()
        release.wait(10)
        return tool(attempt)

    thread, outcome = _run_in_background(ledger, run_id, slow, lease=1)
    try:
        assert started.wait(10)
        seen = []
        for _ in range(2):
            time.sleep(1.25)  # each time past the lease the claim was granted
            with pytest.raises(InProgressError) as in_progress:
                ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool, wait=0)
            seen.append((type(in_progress.value), in_progress.value.entry.status))
        assert seen == [(InProgressError, Status.ATTEMPTING)] * 2
    finally:
        release.set()
        thread.join(10)
    assert not outcome[0].replayed and len(tool.calls) == 1
    entry = ledger.lookup(outcome[0].entry.key)
    assert entry.status == Status.SUCCEEDED and entry.attempt == 1


def test_without_renewal_the_same_slow_action_reads_unknown(ledger: Ledger, run_id: str) -> None:
    """The control for the test above: renew=False, and the lease ends under the action."""
    started, release = threading.Event(), threading.Event()

    def slow(attempt: Attempt) -> object:
        started.set()
        release.wait(10)
        return {"late": True}

    thread, outcome = _run_in_background(ledger, run_id, slow, lease=1, renew=False)
    try:
        assert started.wait(10)
        time.sleep(1.25)
        with pytest.raises(OutcomeUnknownError):
            ledger.run_once(run_id, "issue_credit", ARGS, Tool(), wait=0)
    finally:
        release.set()
        thread.join(10)
    # The claimant's own late Complete still settles it (nobody resolved it meanwhile).
    assert outcome[0].value == {"late": True}


def test_the_bytes_codec_stores_bytes_as_they_are(ledger: Ledger, run_id: str) -> None:
    payload = b"\x00\xffraw"
    first = ledger.run_once(run_id, "t", {}, lambda attempt: payload, codec=BYTES)
    again = ledger.run_once(run_id, "t", {}, lambda attempt: b"other", codec=BYTES)
    assert first.value == again.value == payload and again.replayed


def test_an_explicit_key_replays_and_refuses_other_arguments(ledger: Ledger, run_id: str) -> None:
    key = f"{run_id}:step-3"
    tool = Tool()
    ledger.run_once("", "issue_credit", ARGS, tool, key=key)
    assert ledger.run_once("", "issue_credit", ARGS_REORDERED, tool, key=key).replayed
    with pytest.raises(KeyReused) as reused:
        ledger.run_once("", "issue_credit", {**ARGS, "amount": 300}, tool, key=key)
    assert reused.value.reason == "KEY_REUSED_WITH_DIFFERENT_REQUEST"
    assert len(tool.calls) == 1


def test_a_result_the_ledger_refuses_is_unknown_at_once_and_says_how_to_settle_it(
        ledger_bin: Path, tmp_path: Path, run_id: str) -> None:
    # As the TypeScript client: a result over --max-result-bytes (RESULT_TOO_LARGE) after the
    # action ran means the effect happened but cannot be replayed; the entry is recorded UNKNOWN
    # at once instead of being left ATTEMPTING until its lease ends.
    small = LedgerServer(ledger_bin, directory=tmp_path, args=["--max-result-bytes", "1024"])
    with small, Ledger(small.address) as ledger:
        tool = Tool(result="x" * 2048)
        with pytest.raises(ResultNotEncodable) as refused:
            ledger.run_once(run_id, "t", {"n": 1}, tool)
        e = refused.value
        assert isinstance(e.__cause__, InvalidArgument)
        assert e.__cause__.reason == "RESULT_TOO_LARGE"
        entry = ledger.lookup(run_id=run_id, tool="t", arguments={"n": 1})
        assert entry.status == Status.UNKNOWN and "result could not be stored" in entry.error
        assert e.entry is not None and e.entry.status == Status.UNKNOWN
        assert "Reconcile" in str(e) and "idempotency-ledger resolve" in str(e)
        with pytest.raises(OutcomeUnknownError):
            ledger.run_once(run_id, "t", {"n": 1}, tool, wait=0)
        assert len(tool.calls) == 1
