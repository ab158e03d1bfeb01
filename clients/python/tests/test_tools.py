"""@ledger.tool(): one line makes a tool function run once per intent, on both clients, for plain
and async functions, keeping the function's signature; against the real server."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import typing
from dataclasses import dataclass
from enum import Enum

import pytest

from idempotency_ledger import (
    AsyncLedger,
    Ledger,
    NoRunId,
    NotExecuted,
    PermanentFailure,
    ResultNotEncodable,
    Status,
    current_attempt,
    run_scope,
)
from idempotency_ledger.testing import LedgerServer

UNKNOWN_NOTE = ("An earlier attempt of this action may or may not have taken effect: its outcome "
                "is unknown and is being reconciled. Do not repeat it. No new action was taken.")
ALREADY_DONE = ("This action was already performed in this run; returning the earlier result. "
                "No new action was taken.")


class Currency(Enum):
    EUR = "EUR"


@dataclass
class Memo:
    text: str


class World:
    """Fake side effects: what each tool did, in order."""

    def __init__(self) -> None:
        self.effects: list[tuple[str, dict]] = []
        self.lock = threading.Lock()

    def act(self, tool: str, **details: object) -> dict:
        with self.lock:
            self.effects.append((tool, details))
            return {"id": f"{tool}-{len(self.effects)}"}


def test_a_plain_function_runs_once_per_intent_and_keeps_its_signature(
        ledger: Ledger, run_id: str) -> None:
    world = World()

    @ledger.tool(run_id=run_id)
    def issue_credit(customer: str, amount: int, currency: str = "EUR") -> dict:
        """Issues a credit."""
        return world.act("issue_credit", customer=customer, amount=amount,
                         ref=current_attempt().external_ref)

    assert issue_credit.__name__ == "issue_credit" and issue_credit.__doc__ == "Issues a credit."
    assert str(inspect.signature(issue_credit)) == (
        "(customer: str, amount: int, currency: str = 'EUR') -> dict")
    assert typing.get_type_hints(issue_credit) == {"customer": str, "amount": int,
                                                   "currency": str, "return": dict}
    assert not inspect.iscoroutinefunction(issue_credit)

    first = issue_credit("c-42", 200, currency="EUR")
    again = issue_credit(currency="EUR", amount=200, customer="c-42")
    assert first == {"id": "issue_credit-1"}
    assert again == {"status": "already_done", "note": ALREADY_DONE, "result": first}
    assert len(world.effects) == 1
    entry = ledger.lookup(run_id=run_id, tool="issue_credit",
                          arguments={"customer": "c-42", "amount": 200, "currency": "EUR"})
    assert world.effects[0][1]["ref"] == entry.external_ref
    # The default the model did not send is not part of the intent: another key.
    assert issue_credit("c-42", 200) == {"id": "issue_credit-2"}


def test_the_run_id_comes_from_the_option_the_scope_or_nowhere(ledger: Ledger,
                                                               run_id: str) -> None:
    world = World()
    current = {"run": f"{run_id}-a"}

    @ledger.tool("send_reply", run_id=lambda: current["run"])
    def reply(text: str) -> dict:
        return world.act("send_reply", text=text)

    @ledger.tool()
    def scoped(text: str) -> dict:
        return world.act("scoped", text=text)

    reply("hi")
    current["run"] = f"{run_id}-b"
    reply("hi")  # a new run is a new intent
    assert len(world.effects) == 2
    with run_scope(f"{run_id}-c"):
        scoped("hi")
        assert scoped("hi")["status"] == "already_done"
    with pytest.raises(NoRunId, match="run_scope"):
        scoped("hi")
    assert len(world.effects) == 3
    with pytest.raises(ValueError), run_scope(""):
        pass


def test_the_outcomes_that_are_not_a_result_reach_the_model_as_notes(ledger: Ledger,
                                                                     run_id: str) -> None:
    started, release = threading.Event(), threading.Event()

    @ledger.tool(run_id=run_id, wait=0)
    def slow(n: int) -> dict:
        if n == 1:
            started.set()
            release.wait(10)
        return {"n": n}

    @ledger.tool(run_id=run_id)
    def refuse(customer: str) -> dict:
        raise PermanentFailure(f"customer {customer} does not exist")

    @ledger.tool(run_id=run_id)
    def times_out(n: int) -> dict:
        raise TimeoutError("no answer in 5 s")

    first: list = []
    thread = threading.Thread(target=lambda: first.append(slow(1)))
    thread.start()
    try:
        assert started.wait(10)
        in_progress = slow(1)
        assert in_progress["status"] == "in_progress"
        assert in_progress["note"].startswith("This action is already being performed")
        assert in_progress["retry_after_seconds"] > 0
    finally:
        release.set()
        thread.join(10)
    assert first == [{"n": 1}]

    with pytest.raises(PermanentFailure):  # this call's own failure: the framework's to handle
        refuse("c-404")
    failed = refuse("c-404")
    assert failed["status"] == "previously_failed"
    assert "error" not in failed  # the note quotes it: the model reads it once
    assert failed["note"].count("customer c-404 does not exist") == 1

    # An exception raised once the function started: the outcome is unknown, and the model reads
    # the ledger's note as a normal result, on the call and on the repeat alike.
    unknown = times_out(1)
    assert unknown == {"status": "outcome_unknown", "note": UNKNOWN_NOTE}
    assert times_out(1) == unknown


def test_a_refusal_before_acting_is_retryable(ledger: Ledger, run_id: str) -> None:
    class RateLimited(Exception):
        pass

    calls: list[int] = []

    @ledger.tool(run_id=run_id, not_executed=(RateLimited,))
    def send(n: int) -> dict:
        calls.append(n)
        if len(calls) == 1:
            raise RateLimited("429")
        if len(calls) == 2:
            raise NotExecuted("503 before acting")
        return {"sent": n, "attempt": current_attempt().number}

    with pytest.raises(RateLimited):  # the function's own exception, as without the ledger
        send(1)
    entry = ledger.lookup(run_id=run_id, tool="send", arguments={"n": 1})
    assert (entry.status, entry.retryable, entry.error) == (Status.FAILED, True,
                                                            "RateLimited: 429")
    with pytest.raises(NotExecuted):
        send(1)
    assert send(1) == {"sent": 1, "attempt": 3}


def test_the_wrappers_own_errors_claim_nothing(ledger: Ledger, run_id: str) -> None:
    @ledger.tool(run_id=run_id)
    def credit(amount: int) -> dict:
        return {"amount": amount}

    with pytest.raises(TypeError):
        credit(1, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="cannot be recorded as JSON"):
        credit({1, 2})  # type: ignore[arg-type]
    assert list(ledger.list_entries(run_id=run_id)) == []
    with pytest.raises(ValueError, match="exclude names no parameter"):
        ledger.tool(exclude=("nope",))(credit)


def test_typed_arguments_are_recorded_in_their_json_form(ledger: Ledger, run_id: str) -> None:
    @ledger.tool(run_id=run_id, exclude=("session",))
    def note(memo: Memo, currency: Currency, session: object = None, **extra: object) -> str:
        return f"{memo.text} {currency.value}"

    assert note(Memo("hi"), Currency.EUR, session=object(), tag="x") == "hi EUR"
    (entry,) = ledger.list_entries(run_id=run_id)
    assert entry.arguments_json == '{"currency":"EUR","memo":{"text":"hi"},"tag":"x"}'
    assert note(Memo("hi"), Currency.EUR, session=object(), tag="x")["status"] == "already_done"


def test_an_unencodable_result_is_raised_not_hidden(ledger: Ledger, run_id: str) -> None:
    @ledger.tool(run_id=run_id)
    def bad() -> object:
        return object()

    with pytest.raises(ResultNotEncodable):
        bad()
    assert bad()["status"] == "outcome_unknown"


def test_an_action_timeout_reads_as_unknown_to_the_model(ledger: Ledger, run_id: str) -> None:
    release = threading.Event()

    @ledger.tool(run_id=run_id, action_timeout=0.2)
    def hangs() -> dict:
        release.wait(10)
        return {}

    try:
        assert hangs()["status"] == "outcome_unknown"
    finally:
        release.set()


def test_a_coroutine_function_on_the_blocking_client(ledger: Ledger, run_id: str) -> None:
    world = World()

    @ledger.tool(run_id=run_id)
    async def issue_credit(customer: str, amount: int) -> dict:
        await asyncio.sleep(0.2)
        return world.act("issue_credit", customer=customer, ref=current_attempt().external_ref)

    assert inspect.iscoroutinefunction(issue_credit)

    async def main() -> list:
        return await asyncio.gather(issue_credit("c-42", 200), issue_credit("c-42", 200))

    started = time.monotonic()
    results = asyncio.run(main())
    # The second call's claim is held by the server while the first attempt is in flight. Had
    # it been made on the event loop's thread, the loop could not finish the first attempt: the
    # second would read in_progress after its 10 s wait, not the replay.
    assert sorted(r.get("status", "fresh") for r in results) == ["already_done", "fresh"]
    assert time.monotonic() - started < 5
    assert len(world.effects) == 1


def test_both_kinds_of_function_on_the_async_client(server: LedgerServer, run_id: str) -> None:
    world = World()

    async def main() -> None:
        async with AsyncLedger(server.address) as ledger:
            @ledger.tool(run_id=run_id)
            async def issue_credit(customer: str, amount: int) -> dict:
                await asyncio.sleep(0.1)
                return world.act("issue_credit", ref=current_attempt().external_ref)

            @ledger.tool(run_id=run_id)
            def send_reply(text: str) -> dict:  # a plain function: run in a thread
                return world.act("send_reply", thread=threading.current_thread().name,
                                 ref=current_attempt().external_ref)

            assert inspect.iscoroutinefunction(issue_credit)
            assert inspect.iscoroutinefunction(send_reply)
            assert str(inspect.signature(send_reply)) == "(text: str) -> dict"
            results = await asyncio.gather(*(issue_credit("c-42", 200) for _ in range(3)))
            assert sum("status" not in r for r in results) == 1
            assert (await send_reply("hi")) == {"id": "send_reply-2"}
            assert (await send_reply("hi"))["status"] == "already_done"

    asyncio.run(main())
    assert [tool for tool, _ in world.effects] == ["issue_credit", "send_reply"]
    assert world.effects[1][1]["thread"] != threading.current_thread().name
