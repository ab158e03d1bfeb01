"""The asyncio client (grpc.aio): run_once and typed errors, against the real server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from idempotency_ledger import (
    ActionTimeout,
    AsyncLedger,
    Attempt,
    InProgressError,
    InvalidArgument,
    LeaseEnded,
    NotExecuted,
    NotFound,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    ResultNotEncodable,
    Status,
    current_attempt,
)
from idempotency_ledger.testing import LedgerServer

ARGS = {"customer": "c-42", "amount": 200, "currency": "EUR"}
ARGS_REORDERED = '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}'


def run(server: LedgerServer, body: Callable[[AsyncLedger], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        async with AsyncLedger(server.address, timeout=10) as ledger:
            return await body(ledger)

    return asyncio.run(main())


class AsyncTool:
    def __init__(self, delay: float = 0.0, error: BaseException | None = None) -> None:
        self.calls: list[Attempt] = []
        self.delay = delay
        self.error = error

    async def __call__(self, attempt: Attempt) -> dict:
        self.calls.append(attempt)
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return {"credit_id": f"cr-{len(self.calls)}"}


def test_reordered_arguments_run_once_and_a_new_run_twice(server: LedgerServer,
                                                          run_id: str) -> None:
    tool = AsyncTool()

    async def body(ledger: AsyncLedger) -> None:
        first = await ledger.run_once(run_id, "issue_credit", ARGS, tool)
        again = await ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool)
        assert len(tool.calls) == 1
        assert again.replayed and again.value == first.value == {"credit_id": "cr-1"}
        assert "already performed" in again.note
        other = await ledger.run_once(run_id + "-new", "issue_credit", ARGS_REORDERED, tool)
        assert not other.replayed and len(tool.calls) == 2

    run(server, body)


def test_a_plain_function_is_an_action_too(server: LedgerServer, run_id: str) -> None:
    async def body(ledger: AsyncLedger) -> None:
        result = await ledger.run_once(run_id, "t", {}, lambda attempt: attempt.number)
        assert result.value == 1

    run(server, body)


def test_concurrent_calls_of_one_intent_run_it_once(server: LedgerServer, run_id: str) -> None:
    tool = AsyncTool(delay=0.3)

    async def body(ledger: AsyncLedger) -> None:
        results = await asyncio.gather(
            *(ledger.run_once(run_id, "issue_credit", ARGS, tool, wait=5) for _ in range(5))
        )
        assert len(tool.calls) == 1
        assert sorted(r.replayed for r in results) == [False, True, True, True, True]
        assert {r.value["credit_id"] for r in results} == {"cr-1"}

    run(server, body)


class HeldTool(AsyncTool):
    """An AsyncTool that holds each call until the test releases it: no race against a delay."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, attempt: Attempt) -> dict:
        self.started.set()
        await self.release.wait()
        return await super().__call__(attempt)


def test_without_waiting_a_call_in_flight_is_in_progress(server: LedgerServer,
                                                         run_id: str) -> None:
    tool = HeldTool()

    async def body(ledger: AsyncLedger) -> None:
        first = asyncio.create_task(ledger.run_once(run_id, "issue_credit", ARGS, tool))
        await tool.started.wait()
        with pytest.raises(InProgressError) as in_progress:
            await ledger.run_once(run_id, "issue_credit", ARGS, tool, wait=0)
        assert in_progress.value.entry.status == Status.ATTEMPTING
        assert in_progress.value.retry_after
        tool.release.set()
        assert not (await first).replayed
        assert len(tool.calls) == 1

    run(server, body)


def test_a_slow_action_keeps_its_lease(server: LedgerServer, run_id: str) -> None:
    """Lease 1 s, action 3 s: renewed every third of the lease, a duplicate sees ATTEMPTING."""
    tool = HeldTool()

    async def body(ledger: AsyncLedger) -> None:
        first = asyncio.create_task(ledger.run_once(run_id, "issue_credit", ARGS, tool, lease=1))
        await tool.started.wait()
        for _ in range(2):
            await asyncio.sleep(1.25)
            with pytest.raises(InProgressError) as in_progress:
                await ledger.run_once(run_id, "issue_credit", ARGS_REORDERED, tool, wait=0)
            assert not isinstance(in_progress.value, OutcomeUnknownError)
            assert in_progress.value.entry.status == Status.ATTEMPTING
        tool.release.set()
        result = await first
        assert not result.replayed and result.entry.status == Status.SUCCEEDED
        # The renewals ended with the action: the entry is resolved, so a renewal is refused.
        with pytest.raises(LeaseEnded):
            await ledger.renew_lease(result.entry.key, tool.calls[0].claim_token, 1)
        assert len(tool.calls) == 1

    run(server, body)


def test_an_awaitable_that_outlives_its_timeout_is_cancelled_and_unknown(
        server: LedgerServer, run_id: str) -> None:
    tool = HeldTool()

    async def body(ledger: AsyncLedger) -> None:
        with pytest.raises(ActionTimeout) as timed_out:
            await ledger.run_once(run_id, "issue_credit", ARGS, tool, action_timeout=0.2)
        e = timed_out.value
        assert isinstance(e, OutcomeUnknownError) and isinstance(e.__cause__, TimeoutError)
        assert e.entry is not None and e.entry.status == Status.UNKNOWN
        assert "within 0.2 s" in e.entry.error
        with pytest.raises(OutcomeUnknownError):
            await ledger.run_once(run_id, "issue_credit", ARGS, AsyncTool(), wait=0)

        async def own_timeout(attempt: Attempt) -> None:
            raise TimeoutError("the API's own timeout")  # not ours: plain UNKNOWN, re-raised

        with pytest.raises(TimeoutError) as plain:
            await ledger.run_once(run_id, "t", {}, own_timeout, action_timeout=5)
        assert not isinstance(plain.value, ActionTimeout)

    run(server, body)


def test_wrong_arity_and_unencodable_results(server: LedgerServer, run_id: str) -> None:
    async def no_attempt() -> int:
        return 1

    async def body(ledger: AsyncLedger) -> None:
        with pytest.raises(TypeError):
            await ledger.run_once(run_id, "a", {}, no_attempt)  # type: ignore[arg-type]
        entry = await ledger.lookup(run_id=run_id, tool="a", arguments={})
        assert (entry.status, entry.retryable) == (Status.FAILED, True)

        async def returns_a_set(attempt: Attempt) -> set:
            return {1, 2}

        with pytest.raises(ResultNotEncodable) as unencodable:
            await ledger.run_once(run_id, "b", {}, returns_a_set)
        assert unencodable.value.entry is not None
        assert unencodable.value.entry.status == Status.UNKNOWN

    run(server, body)


def test_the_attempt_is_not_visible_outside_a_tool(server: LedgerServer) -> None:
    async def body(ledger: AsyncLedger) -> None:
        with pytest.raises(LookupError, match="only while"):
            current_attempt()

    run(server, body)


def test_failures_timeouts_and_cancellations_are_recorded(server: LedgerServer,
                                                          run_id: str) -> None:
    async def timed_out(attempt: Attempt) -> None:
        await asyncio.wait_for(asyncio.sleep(5), timeout=0.05)

    async def body(ledger: AsyncLedger) -> None:
        with pytest.raises(NotExecuted):
            await ledger.run_once(run_id, "a", {}, AsyncTool(error=NotExecuted("429")))
        assert (await ledger.run_once(run_id, "a", {}, AsyncTool())).entry.attempt == 2

        with pytest.raises(PermanentFailure):
            await ledger.run_once(run_id, "b", {}, AsyncTool(error=PermanentFailure("no")))
        with pytest.raises(PreviouslyFailedError):
            await ledger.run_once(run_id, "b", {}, AsyncTool())

        with pytest.raises(TimeoutError):
            await ledger.run_once(run_id, "c", {}, timed_out)
        entry = await ledger.lookup(run_id=run_id, tool="c", arguments={})
        assert entry.status == Status.UNKNOWN and entry.error.startswith("TimeoutError")
        with pytest.raises(OutcomeUnknownError):
            await ledger.run_once(run_id, "c", {}, AsyncTool())

        slow = AsyncTool(delay=5)
        task = asyncio.create_task(ledger.run_once(run_id, "d", {}, slow))
        while not slow.calls:  # cancel while the action runs, not while claiming
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = await ledger.lookup(run_id=run_id, tool="d", arguments={})
        assert cancelled.status == Status.UNKNOWN and "CancelledError" in cancelled.error

    run(server, body)


def test_errors_are_typed(server: LedgerServer) -> None:
    async def body(ledger: AsyncLedger) -> None:
        with pytest.raises(InvalidArgument) as refused:
            await ledger.claim("r", "t", '{"a":1,"a":2}')
        assert (refused.value.reason, refused.value.field) == ("DUPLICATE_MEMBER",
                                                               "arguments_json")
        with pytest.raises(NotFound):
            await ledger.lookup("no-such-key")

    run(server, body)


def test_a_claim_cancelled_while_waiting_is_released_not_left_to_read_unknown(
        server: LedgerServer, run_id: str) -> None:
    from idempotency_ledger import Ledger

    tool = AsyncTool()

    async def body(ledger: AsyncLedger) -> None:
        with Ledger(server.address) as holder:
            first = holder.claim(run_id, "issue_credit", ARGS)
            waiter = asyncio.create_task(
                ledger.run_once(run_id, "issue_credit", ARGS, tool, wait=10))
            # The waiter's claim is held by the server while the first attempt is in flight.
            while (await ledger.lookup(first.key)).status != Status.ATTEMPTING:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            # The first attempt fails retryably: the server hands the claim to the waiter,
            # whose caller is gone. The client releases it as not executed.
            holder.complete(first.key, first.claim_token, Status.FAILED, error="429",
                            retryable=True)
            for _ in range(200):
                entry = await ledger.lookup(first.key)
                if entry.attempt == 2 and entry.status != Status.ATTEMPTING:
                    break
                await asyncio.sleep(0.02)
            assert (entry.attempt, entry.status, entry.retryable) == (2, Status.FAILED, True)
            assert "cancelled while claiming" in entry.error
            assert not tool.calls

    run(server, body)
