"""The clients: :class:`LedgerClient` (blocking, on ``grpc``) and :class:`AsyncLedgerClient`
(asyncio, on ``grpc.aio``), each with the RPCs (``list_entries`` pages through ListEntries as an
iterator), :meth:`~LedgerClient.run_once`, the call agent code wants, and
:meth:`~LedgerClient.attempt`, the same without raising. ``idempotency_ledger.Ledger`` and
``AsyncLedger`` are these with ``tool()``, the decorator of the layer above (``tools``).

``run_once(run_id, tool, arguments, action)``:

1. Claims the key of (run_id, tool, arguments), waiting up to `wait` seconds (the server's own
   wait) for an attempt already in flight to finish.
2. ``CLAIMED``: runs ``action(attempt)`` and completes the entry with what happened:

   - it returned a value: ``SUCCEEDED`` with ``codec.encode(value)``; returns a :class:`Result`
     with ``replayed=False``;
   - it raised :class:`NotExecuted` (the effect certainly did not happen), or an exception of a
     class in ``not_executed``, or one raised from either: ``FAILED``, retryable, so the next
     call of the intent runs it again; re-raises;
   - it raised :class:`PermanentFailure`: ``FAILED``, not retryable; re-raises;
   - anything else (``TimeoutError``, a dropped connection, a framework's retry exception, a
     cancellation, a result the codec cannot encode): ``UNKNOWN``, since the effect may have
     happened. With a ``confirm`` (the tool's paired read), the outcome is settled at once,
     under the call's own claim (its lease still renewed): after ``confirm_delay`` the effect
     found means ``SUCCEEDED`` with the result it found (returned as if the action had
     answered), none means ``FAILED`` retryable (:class:`NotExecuted` is raised); otherwise the
     entry is completed ``UNKNOWN``, the action's exception is re-raised and the entry waits for
     a repeat or a reconciler, never re-executed.

3. ``REPLAYED``: returns the stored result decoded, ``replayed=True``, with the ledger's note for
   the model; the action is not run.
4. ``IN_PROGRESS`` (still, after the wait): raises :class:`InProgressError` with ``retry_after``,
   or :class:`OutcomeUnknownError` when the earlier attempt's outcome is unknown (with a
   ``confirm``, an unknown outcome whose lease ended is settled first, then claimed again).
5. ``PREVIOUSLY_FAILED``: raises :class:`PreviouslyFailedError` with the stored error.

What run_once decides is written once, in ``_run_once``, for both clients, and so is each public
method: ``_calls.Calls`` holds them (signature, defaults, documentation), each building its
request and handing one of the core's operations to the client's driver. :class:`LedgerClient`
inherits them and drives with blocking calls and threads (``_blocking``);
:class:`AsyncLedgerClient` binds each with ``awaiting`` and drives with awaits and tasks
(``_aio``), its table below. Why this rather than generating the blocking file from the asyncio
one, as httpcore does with unasync: the core already makes the two clients differ only in how
they wait, so what remains per client is its driver, which a token rewrite could not produce
anyway (threads against tasks); the methods are then one short call each, and one definition
with a one-line binding keeps a single source with no generated copy to keep in step (and no
build step), while mypy and ``help()`` see real signatures (the blocking methods are plain
``def``s; the asyncio ones are ``async def`` wrappers carrying the same signature).

Every RPC has a deadline: the client's `timeout` (10 s unless given), or the call's own
``timeout=``; a claim that waits gets at least its wait plus a second. ``timeout`` never bounds the
action. Claim, Lookup, RenewLease and Complete that meet ``UNAVAILABLE`` are sent again after the
server's ``RetryInfo`` delay within ``retry_budget`` seconds (Complete: at least the lease).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from ._aio import AioDriver
from ._blocking import BlockingDriver
from ._calls import (  # the defaults too, imported from here by the package
    ASYNC_ACTION,
    DEFAULT_CONFIRM_DELAY,
    DEFAULT_RETRY_BUDGET,
    DEFAULT_TIMEOUT,
    DEFAULT_WAIT,
    RENEW_EVERY_FRACTION_OF_LEASE,
    Calls,
    awaiting,
    iterating,
)
from ._proto import ledger_pb2_grpc as pb_grpc

__all__ = ["AsyncLedgerClient", "LedgerClient"]

# How fast a broken channel tries to connect again. gRPC's default backoff grows to two minutes,
# so a channel broken by a ten-second failover could stay down long after the server is back.
_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 2000))

def _channel_options(options: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    given = list(options)
    names = {name for name, _ in given}
    return given + [(n, v) for n, v in _CHANNEL_OPTIONS if n not in names]


class LedgerClient(BlockingDriver, Calls):
    """A blocking client of the ledger.

    Args:
        target: the server: ``host:port`` (plaintext unless `tls` or `root_certificates`),
            ``http://host:port`` (plaintext) or ``https://host:port`` (TLS), as the TypeScript
            client and the CLI take it.
        token: the bearer token of your tenant, when the server has credentials.
        root_certificates: PEM roots (bytes or a file path) to verify the server's TLS certificate
            with; giving them turns TLS on.
        tls: TLS with the system's roots when True (and no `root_certificates`); plaintext when
            False or unset without roots.
        timeout: the deadline of every RPC, in seconds, unless the call sets its own. It bounds
            each call to the ledger, never the action ``run_once`` runs (``action_timeout``).
        principal: who asks, stored with each claim for the audit trail (a claim may override),
            and recorded as ``resolved_by`` on the unknown outcomes a repeat settles with the
            tool's ``confirm`` (a call's own principal first; default ``confirm@<host>:<pid>``).
        retry_budget: how long, in seconds, Claim, Lookup, RenewLease and Complete are sent again
            after ``UNAVAILABLE`` (a failover), after the server's ``RetryInfo`` delay; Complete
            after an action at least as long as the lease. 0 sends each call once.
        require_confirm: strict mode: ``ledger.tool()``, the adapters, ``run_once`` and
            ``attempt`` refuse a tool without a ``confirm`` (``ValueError``, before anything is
            claimed): a tool that cannot be reconciled cannot be safely retried.
        channel: a ready ``grpc.Channel`` to use instead (then `target`, TLS are not used).
        options: gRPC channel options.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | str | Path | None = None,
        tls: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        principal: str = "",
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        require_confirm: bool = False,
        channel: grpc.Channel | None = None,
        options: Iterable[tuple[str, Any]] = (),
    ) -> None:
        super().__init__(target, token=token, root_certificates=root_certificates, tls=tls,
                         timeout=timeout, principal=principal, retry_budget=retry_budget,
                         require_confirm=require_confirm)
        if channel is None:
            channel = (
                grpc.secure_channel(self.address, self._credentials,
                                    options=_channel_options(options))
                if self._credentials
                else grpc.insecure_channel(self.address, options=_channel_options(options))
            )
        self._channel = channel
        self._stub = pb_grpc.LedgerServiceStub(channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLedgerClient(AioDriver):
    """The asyncio client (``grpc.aio``): the same methods as :class:`LedgerClient`, as coroutines.
    Create it inside the running event loop (``async with AsyncLedger(...) as ledger:``).
    ``run_once``'s action may be a plain function or return an awaitable; so may ``confirm``
    (a plain one runs in a thread)."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | str | Path | None = None,
        tls: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        principal: str = "",
        retry_budget: float = DEFAULT_RETRY_BUDGET,
        require_confirm: bool = False,
        channel: grpc.aio.Channel | None = None,
        options: Iterable[tuple[str, Any]] = (),
    ) -> None:
        super().__init__(target, token=token, root_certificates=root_certificates, tls=tls,
                         timeout=timeout, principal=principal, retry_budget=retry_budget,
                         require_confirm=require_confirm)
        if channel is None:
            channel = (
                grpc.aio.secure_channel(self.address, self._credentials,
                                        options=_channel_options(options))
                if self._credentials
                else grpc.aio.insecure_channel(self.address, options=_channel_options(options))
            )
        self._channel = channel
        self._stub = pb_grpc.LedgerServiceStub(channel)
        # Completions that outlive the call that started them (a claim released after its
        # caller was cancelled), referenced so they are not collected mid-flight.
        self._background: set[asyncio.Future[Any]] = set()

    async def close(self) -> None:
        """Waits for the completions still in flight (releases of cancelled claims), then
        closes the channel."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.timeout)
        await self._channel.close()

    async def __aenter__(self) -> AsyncLedgerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- the calls: LedgerClient's, each awaited (see the module's documentation) -------------

    claim = awaiting(Calls.claim)
    complete = awaiting(Calls.complete)
    lookup = awaiting(Calls.lookup)
    reconcile = awaiting(Calls.reconcile)
    renew_lease = awaiting(Calls.renew_lease)
    list_entries = iterating(Calls.list_entries, """: an async iterator (``async for entry in
        ...``).""")
    decide = awaiting(Calls.decide)
    extend_run = awaiting(Calls.extend_run)
    watch_approvals = iterating(Calls.watch_approvals,
                                """: an async iterator (``async for event in
        ...``).""")
    run_once = awaiting(Calls.run_once, """. A cancellation of the action is recorded as
        ``UNKNOWN`` and re-raised. `action_timeout` cancels the awaitable the action returned
        when it has not finished by then (a plain function that blocks cannot be interrupted:
        give the ``AsyncLedger`` awaitables, or run blocking work with ``asyncio.to_thread``).""",
                        action=ASYNC_ACTION)
    attempt = awaiting(Calls.attempt, action=ASYNC_ACTION)
