"""run_once through the blocking client, against the real server."""

from __future__ import annotations

import threading
import time

import pytest

from idempotency_ledger import (
    BYTES,
    Attempt,
    InProgressError,
    KeyReused,
    Ledger,
    NotExecuted,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    Status,
)

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


def _run_in_background(ledger: Ledger, run_id: str, action) -> tuple[threading.Thread, list]:
    outcome: list = []

    def target() -> None:
        try:
            outcome.append(ledger.run_once(run_id, "issue_credit", ARGS, action))
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


def test_any_other_error_and_an_unencodable_result_complete_unknown(ledger: Ledger,
                                                                     run_id: str) -> None:
    with pytest.raises(ConnectionResetError):
        ledger.run_once(run_id, "send_reply", {"n": 1}, Tool(error=ConnectionResetError("reset")))
    with pytest.raises(TypeError):
        ledger.run_once(run_id, "send_reply", {"n": 2}, Tool(result=object()))
    for n in (1, 2):
        assert ledger.lookup(run_id=run_id, tool="send_reply",
                             arguments={"n": n}).status == Status.UNKNOWN


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
