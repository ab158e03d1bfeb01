"""A repeat costs one Claim whatever it meets (issue 35, item 6): run-once sends the call's
`wait` with ``WAIT_FOR_ATTEMPT``, so the server holds it for an attempt in flight and answers a
call awaiting a person's decision at once. The Claims are counted as the client sends them, by a
gRPC interceptor on the real channel to the real server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from conftest import AGENT_TOKEN

from idempotency_ledger import AsyncLedger, Kind, Ledger
from idempotency_ledger._proto import ledger_pb2 as pb
from idempotency_ledger.testing import LedgerServer

CREDIT = {"customer": "c-42", "amount": 200}
REFUND = {"order": "o-3", "amount": 400}  # over the approval policy's 100


class ClaimCounter(grpc.UnaryUnaryClientInterceptor):
    """Keeps every Claim request the client sends, and says when one has gone out."""

    def __init__(self) -> None:
        self.claims: list[pb.ClaimRequest] = []
        self.sent = threading.Event()

    def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                              request: Any) -> Any:
        if details.method.endswith("/Claim"):
            self.claims.append(request)
            self.sent.set()
        return continuation(details, request)


class AsyncClaimCounter(grpc.aio.UnaryUnaryClientInterceptor):
    """:class:`ClaimCounter` for the asyncio client's channel."""

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.claims: list[pb.ClaimRequest] = []
        self.on_first = on_first

    async def intercept_unary_unary(self, continuation: Callable[..., Any], details: Any,
                                    request: Any) -> Any:
        if details.method.endswith(b"/Claim"):  # bytes on the asyncio channel
            self.claims.append(request)
            if len(self.claims) == 1:
                self.on_first()
        return await continuation(details, request)


def counted(server: LedgerServer, token: str | None = None) -> tuple[Ledger, ClaimCounter]:
    counter = ClaimCounter()
    channel = grpc.intercept_channel(grpc.insecure_channel(server.address), counter)
    return Ledger(server.address, token=token, channel=channel, timeout=10), counter


def _in_flight(ledger: Ledger, run_id: str, release: threading.Event,
               results: list[Any]) -> threading.Thread:
    """An attempt of the intent that acts until `release` is set."""
    def act(attempt: Any) -> dict:
        release.wait(20)
        return {"credit_id": "cr-1"}

    first = threading.Thread(target=lambda: results.append(
        ledger.run_once(run_id, "issue_credit", CREDIT, act)))
    first.start()
    deadline = time.monotonic() + 10
    while not _claimed(ledger, run_id):
        assert time.monotonic() < deadline, "the first attempt never started"
        time.sleep(0.02)
    return first


def _claimed(ledger: Ledger, run_id: str) -> bool:
    try:
        ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
    except Exception:
        return False
    return True


def test_a_repeat_that_meets_an_attempt_in_flight_sends_one_claim_and_gets_its_result(
        server: LedgerServer, ledger: Ledger, run_id: str) -> None:
    release = threading.Event()
    results: list[Any] = []
    first = _in_flight(ledger, run_id, release, results)
    repeat, counter = counted(server)
    with repeat:
        # The first attempt goes on acting until the repeat's Claim has reached the server.
        threading.Thread(target=lambda: (counter.sent.wait(10), time.sleep(0.5),
                                         release.set())).start()
        started = time.monotonic()
        again = repeat.run_once(run_id, "issue_credit", CREDIT,
                                lambda attempt: {"credit_id": "a second credit"}, wait=10)
        waited = time.monotonic() - started
    first.join(10)
    assert again.replayed and again.value == {"credit_id": "cr-1"}
    assert results[0].value == {"credit_id": "cr-1"} and not results[0].replayed
    assert waited >= 0.4  # it was held for the attempt, not answered "in progress"
    assert len(counter.claims) == 1
    (claim,) = counter.claims
    assert claim.wait.ToTimedelta().total_seconds() == 10
    assert claim.wait_for == pb.WAIT_FOR_ATTEMPT


def test_a_repeat_of_a_call_awaiting_approval_sends_one_claim_answered_at_once(
        approval_server: LedgerServer, run_id: str) -> None:
    agent, counter = counted(approval_server, AGENT_TOKEN)
    with agent:
        asked = agent.attempt(run_id, "issue_refund", REFUND, lambda a: {"refund_id": "rf-1"},
                              wait=5)
        assert asked.kind == Kind.AWAITING_APPROVAL and len(counter.claims) == 1
        started = time.monotonic()
        again = agent.attempt(run_id, "issue_refund", REFUND, lambda a: {"refund_id": "rf-1"},
                              wait=5)
        assert again.kind == Kind.AWAITING_APPROVAL
        assert time.monotonic() - started < 3  # not held for the person's decision
    assert len(counter.claims) == 2  # one for the call, one for its repeat
    assert all(c.wait_for == pb.WAIT_FOR_ATTEMPT for c in counter.claims)


def test_the_async_client_sends_one_claim_per_repeat_too(server: LedgerServer, ledger: Ledger,
                                                         run_id: str) -> None:
    release = threading.Event()
    results: list[Any] = []
    first = _in_flight(ledger, run_id, release, results)

    async def repeat() -> Any:
        loop = asyncio.get_running_loop()
        # The first attempt goes on acting until the repeat's Claim has reached the server.
        counter = AsyncClaimCounter(lambda: loop.call_later(0.5, release.set))
        channel = grpc.aio.insecure_channel(server.address, interceptors=[counter])
        async with AsyncLedger(server.address, channel=channel, timeout=10) as again:
            claims.append(counter)
            return await again.run_once(run_id, "issue_credit", CREDIT,
                                        lambda attempt: {"credit_id": "a second credit"}, wait=10)

    claims: list[AsyncClaimCounter] = []
    again = asyncio.run(repeat())
    first.join(10)
    assert again.replayed and again.value == {"credit_id": "cr-1"}
    (counter,) = claims
    assert len(counter.claims) == 1 and counter.claims[0].wait_for == pb.WAIT_FOR_ATTEMPT
