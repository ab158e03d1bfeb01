"""The blocking client's driver: runs the core's steps (``_core``) with blocking calls, and an
action's time limit and its lease renewals with threads (:class:`Renewer`). The calls themselves
are :class:`~idempotency_ledger._calls.Calls`, shared with the asyncio client."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import Any, TypeVar

import grpc

from . import _core as core
from . import _wire as wire
from ._calls import Base
from .errors import FailedPrecondition, LedgerError, error_from_rpc
from .model import ApprovalEvent, ClaimResult, Entry

T = TypeVar("T")


class BlockingDriver(Base):
    """How the blocking client waits: the steps run in the calling thread, an action with a
    limit and the lease renewals each in a thread of their own."""

    _stub: Any

    def _drive(self, steps: Generator[core.Step, Any, T]) -> T:
        """Runs one of the core's operations to its end with blocking calls."""
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                step = steps.throw(thrown) if thrown is not None else steps.send(sent)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            sent, thrown = None, None
            try:
                sent = self._execute(step)
            except BaseException as e:  # thrown into the operation, which decides
                thrown = e

    def _execute(self, step: core.Step) -> Any:
        if isinstance(step, core.Rpc):
            try:
                return getattr(self._stub, step.method)(step.request, timeout=step.timeout,
                                                        metadata=self._call_metadata())
            except grpc.RpcError as e:
                raise error_from_rpc(e) from e
        if isinstance(step, core.Sleep):
            time.sleep(step.seconds)
            return None
        if isinstance(step, core.Act):
            return self._act(step)
        if isinstance(step, core.Ask):
            answer = step.confirm(step.question)
            if inspect.isawaitable(answer):
                # A coroutine confirm on the blocking client: run it to its end here (this
                # thread has no event loop of its own running).
                return asyncio.run(_awaited(answer))
            return answer
        if isinstance(step, core.StopRenewing):
            step.handle.stop()
            return None
        if isinstance(step, core.ReleaseLate):
            if step.handle is not None:
                step.handle.set()
            return None
        raise TypeError(f"unknown step {step!r}")

    def _act(self, step: core.Act) -> core.Acted:
        renewer = Renewer(self, step.claim, step.timeout) if step.renew else None
        if renewer is not None:
            renewer.start()
        kept = False
        try:
            if step.limit is None:
                try:
                    acted = core.Acted(value=step.action(step.attempt))
                except BaseException as e:  # recorded by the core, then re-raised
                    acted = core.Acted(error=e)
            else:
                acted = self._act_within(step, step.limit)
            if renewer is not None and step.hold and (acted.timed_out
                                                      or isinstance(acted.error, Exception)):
                acted.renewal = renewer  # the core asks confirm under the claim, then stops it
                kept = True
            return acted
        finally:
            if renewer is not None and not kept:
                renewer.stop()

    def _act_within(self, step: core.Act, limit: float) -> core.Acted:
        """Runs the action in a thread of its own and waits up to `limit` seconds for it. An
        action that outlives it runs on (a function cannot be interrupted); what it does after
        all is recorded late, once the core has recorded the unknown outcome."""
        done = threading.Event()
        recorded = threading.Event()
        lock = threading.Lock()
        abandoned = False
        acted = core.Acted()
        context = contextvars.copy_context()  # current_attempt() and the like, in the thread

        def work() -> None:
            try:
                acted.value = context.run(step.action, step.attempt)
            except BaseException as e:  # handed to the waiting thread, or recorded late
                acted.error = e
            with lock:
                done.set()
                late = abandoned
            if late and recorded.wait(max(self.timeout, 60.0)):
                self._drive(step.late(acted))

        worker = threading.Thread(target=work, name=f"ledger-action-{step.claim.key[:12]}",
                                  daemon=True)
        worker.start()
        if not done.wait(limit):
            with lock:
                abandoned = not done.is_set()
            if abandoned:
                return core.Acted(timed_out=True, late=recorded)
        return acted

    def _pages(self, request: Callable[[], Any], timeout: float | None) -> Iterator[Entry]:
        """ListEntries, page by page, as the iteration goes."""
        built = request()
        while True:
            r = self._execute(core.Rpc("ListEntries", built, self._policy.deadline(timeout)))
            yield from (Entry.from_pb(e) for e in r.entries)
            if not wire.next_page(built, r):
                return

    def _watch(self, request: Callable[[], Any]) -> Iterator[ApprovalEvent]:
        """WatchApprovals, event by event; the stream is cancelled when the iteration ends."""
        stream = self._stub.WatchApprovals(request(), metadata=self._call_metadata())
        try:
            for r in stream:
                yield wire.approval_event(r)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from e
        finally:
            stream.cancel()


class Renewer:
    """Renews the lease of a blocking run_once's attempt from a thread of its own while the
    action runs. A renewal that fails for a passing reason is sent again until the next tick,
    and tried at the next tick after that; one the server refuses for good (LEASE_ENDED,
    STALE_CLAIM_TOKEN) ends the renewals."""

    def __init__(self, ledger: BlockingDriver, claim: ClaimResult, timeout: float | None) -> None:
        self._ledger = ledger
        self._claim = claim
        self._lease = core.granted_lease(claim)
        self._timeout = timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The entry after the last successful renewal.
        self.renewed: Entry | None = None

    def start(self) -> None:
        if self._lease is None:
            return
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"ledger-renew-{self._claim.key[:12]}")
        self._thread.start()

    def _run(self) -> None:
        assert self._lease is not None
        interval = Base._renew_interval(self._lease)
        # A renewal slower than the lease left cannot keep it alive anyway.
        deadline = min(self._ledger._policy.deadline(self._timeout), self._lease)
        while not self._stop.wait(interval):
            try:
                self.renewed = self._ledger._drive(core.renew_lease(
                    self._ledger._policy, self._claim.key, self._claim.claim_token, self._lease,
                    deadline, budget=interval))
            except FailedPrecondition:
                return
            except (LedgerError, ValueError):  # ValueError: the channel was closed
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


async def _awaited(value: Awaitable[T]) -> T:
    return await value
