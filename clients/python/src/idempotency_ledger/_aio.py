"""The asyncio client's driver: runs the core's steps (``_core``) with awaits, and an action's
lease renewals as a task; a claim cancelled in flight is released, a Complete is shielded from
the caller's cancellation. The calls themselves are
:class:`~idempotency_ledger._calls.Calls`, bound as coroutines by
:func:`~idempotency_ledger._calls.awaiting`."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Any, TypeVar

import grpc.aio

from . import _core as core
from . import _run_once as once
from . import _wire as wire
from ._calls import Base
from .errors import FailedPrecondition, LedgerError, error_from_rpc
from .model import ApprovalEvent, ClaimResult, Entry, Outcome

T = TypeVar("T")


class AioDriver(Base):
    """How the asyncio client waits: awaits in the caller's task, the lease renewals in a task
    of their own, and releases of cancelled claims in the background (``_background``)."""

    _stub: Any
    _background: set[asyncio.Future[Any]]

    async def _drive(self, steps: Generator[core.Step, Any, T]) -> T:
        """Runs one of the core's operations to its end with awaits."""
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            try:
                step = steps.throw(thrown) if thrown is not None else steps.send(sent)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            sent, thrown = None, None
            try:
                sent = await self._execute(step)
            except BaseException as e:  # thrown into the operation, which decides
                thrown = e

    async def _rpc(self, step: core.Rpc) -> Any:
        try:
            return await getattr(self._stub, step.method)(step.request, timeout=step.timeout,
                                                          metadata=self._call_metadata())
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from e

    async def _execute(self, step: core.Step) -> Any:
        if isinstance(step, core.Rpc):
            if step.method == "Complete":
                # Shielded: recording an outcome is not cancelled with the call that acted.
                return await asyncio.shield(self._rpc(step))
            if step.method == "Claim":
                return await self._claim(step)
            return await self._rpc(step)
        if isinstance(step, core.Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, core.Act):
            return await self._act(step)
        if isinstance(step, core.Ask):
            if _is_coroutine_function(step.confirm):
                return await step.confirm(step.question)
            answer = await asyncio.to_thread(step.confirm, step.question)
            return await answer if inspect.isawaitable(answer) else answer
        if isinstance(step, core.StopRenewing):
            await _cancel(step.handle)
            return None
        if isinstance(step, core.ReleaseLate):
            return None  # an awaitable is cancelled at its limit: nothing comes late
        raise TypeError(f"unknown step {step!r}")

    async def _claim(self, step: core.Rpc) -> Any:
        claiming = asyncio.ensure_future(self._rpc(step))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            # Cancelled while claiming (a framework cancels the sibling tool calls of one that
            # failed): the server may still grant the claim, and nobody would complete it; it
            # would read UNKNOWN when its lease ends. Release it as not executed instead.
            self._background.add(claiming)
            claiming.add_done_callback(self._background.discard)
            claiming.add_done_callback(self._release_if_claimed)
            raise

    def _release_if_claimed(self, claiming: asyncio.Future[Any]) -> None:
        if claiming.cancelled() or claiming.exception() is not None:
            return
        claimed = wire.claim_result(claiming.result())
        if claimed.outcome != Outcome.CLAIMED:
            return
        release = asyncio.ensure_future(self._drive(once.release(self._policy, claimed)))
        self._background.add(release)
        release.add_done_callback(self._background.discard)
        release.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _act(self, step: core.Act) -> core.Acted:
        renewer = asyncio.create_task(self._renew(step.claim, step.timeout)) if step.renew else None
        acted = await self._run_action(step)
        if renewer is not None and step.hold and (acted.timed_out
                                                  or isinstance(acted.error, Exception)):
            acted.renewal = renewer  # the core asks confirm under the claim, then stops it
        elif renewer is not None:
            await _cancel(renewer)
        return acted

    @staticmethod
    async def _run_action(step: core.Act) -> core.Acted:
        try:
            value = step.action(step.attempt)
            if inspect.isawaitable(value):
                if step.limit is None:
                    value = await value
                else:
                    try:
                        async with asyncio.timeout(step.limit) as scope:
                            value = await value
                    except TimeoutError as e:
                        if scope.expired():
                            return core.Acted(error=e, timed_out=True)
                        raise
            return core.Acted(value=value)
        except BaseException as e:  # a cancellation too: recorded UNKNOWN, then re-raised
            return core.Acted(error=e)

    async def _renew(self, claim: ClaimResult, timeout: float | None) -> None:
        """Renews the attempt's lease every third of it until cancelled; see :class:`_Renewer`."""
        lease = core.granted_lease(claim)
        if lease is None:
            return
        interval = self._renew_interval(lease)
        deadline = min(self._policy.deadline(timeout), lease)
        while True:
            await asyncio.sleep(interval)
            try:
                await self._drive(core.renew_lease(self._policy, claim.key, claim.claim_token,
                                                   lease, deadline, budget=interval))
            except FailedPrecondition:
                return
            except LedgerError:
                continue

    async def _pages(self, request: Callable[[], Any], timeout: float | None,
                     ) -> AsyncIterator[Entry]:
        """ListEntries, page by page, as the iteration goes."""
        built = request()
        more = True
        while more:
            r = await self._rpc(core.Rpc("ListEntries", built, self._policy.deadline(timeout)))
            for e in r.entries:
                yield Entry.from_pb(e)
            more = wire.next_page(built, r)

    async def _watch(self, request: Callable[[], Any]) -> AsyncIterator[ApprovalEvent]:
        """WatchApprovals, event by event; the stream is cancelled when the iteration ends."""
        stream = self._stub.WatchApprovals(request(), metadata=self._call_metadata())
        try:
            async for r in stream:
                yield wire.approval_event(r)
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from e
        finally:
            stream.cancel()



def _is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004 (a callable object's async __call__)


async def _awaited(value: Awaitable[T]) -> T:
    return await value


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancels a helper task and waits for it to end. asyncio.wait raises only when the caller
    itself is cancelled meanwhile, never with the helper's own cancellation."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: the renewer's failures end it and change nothing
