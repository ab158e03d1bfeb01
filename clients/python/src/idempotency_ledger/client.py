"""The clients: :class:`Ledger` (blocking, on ``grpc``) and :class:`AsyncLedger` (asyncio, on
``grpc.aio``), each with the RPCs (``list_entries`` pages through ListEntries as an iterator)
and :meth:`~Ledger.run_once`, the call agent code wants.

``run_once(run_id, tool, arguments, action)``:

1. Claims the key of (run_id, tool, arguments), waiting up to `wait` seconds (the server's own
   wait) for an attempt already in flight to finish.
2. ``CLAIMED``: runs ``action(attempt)`` and completes the entry with what happened:

   - it returned a value: ``SUCCEEDED`` with ``codec.encode(value)``; returns a :class:`Result`
     with ``replayed=False``;
   - it raised :class:`NotExecuted` (the effect certainly did not happen): ``FAILED``,
     retryable, so the next call of the intent runs it again; re-raises;
   - it raised :class:`PermanentFailure`: ``FAILED``, not retryable; re-raises;
   - anything else (``TimeoutError``, a dropped connection, a cancellation, a result the codec
     cannot encode): ``UNKNOWN``, since the effect may have happened; re-raises. The entry waits
     for a reconciler and is never re-executed silently.

3. ``REPLAYED``: returns the stored result decoded, ``replayed=True``, with the ledger's note for
   the model; the action is not run.
4. ``IN_PROGRESS`` (still, after the wait): raises :class:`InProgressError` with ``retry_after``,
   or :class:`OutcomeUnknownError` when the earlier attempt's outcome is unknown.
5. ``PREVIOUSLY_FAILED``: raises :class:`PreviouslyFailedError` with the stored error.

Every RPC has a deadline: the client's `timeout` (10 s unless given), or the call's own
``timeout=``; a claim that waits gets at least its wait plus a second.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf import duration_pb2, timestamp_pb2

from idempotency.v1 import ledger_pb2 as pb
from idempotency.v1 import ledger_pb2_grpc as pb_grpc

from .codec import JSON, Codec
from .errors import (
    DeadlineExceeded,
    InProgressError,
    NotExecuted,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    Unavailable,
    _ActionFailure,
    error_from_rpc,
)
from .keys import arguments_json
from .model import (
    Attempt,
    Canonicalization,
    ClaimResult,
    Completion,
    Entry,
    Outcome,
    Reconciliation,
    Resolution,
    Result,
    Status,
)

__all__ = ["AsyncLedger", "Ledger"]

Seconds = float | int | timedelta
Arguments = str | Mapping[str, Any]
T = TypeVar("T")

#: The deadline of a call that sets none.
DEFAULT_TIMEOUT = 10.0
#: How long run_once waits, by default, for an attempt of the same intent already in flight.
DEFAULT_WAIT = 10.0
# A Complete that meets UNAVAILABLE or DEADLINE_EXCEEDED is sent again (an identical Complete is
# idempotent: already_completed), this many times in all.
_COMPLETE_TRIES = 3
_COMPLETE_BACKOFF = 0.2
# The longest error text run_once stores for a failed action.
_MAX_ERROR_CHARS = 4096


# --- conversions ------------------------------------------------------------------------------


def _duration(value: Seconds | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    d = duration_pb2.Duration()
    if isinstance(value, timedelta):
        d.FromTimedelta(value)
    else:
        d.FromNanoseconds(round(value * 1e9))
    return d


def _seconds(value: Seconds | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A protobuf Timestamp; a naive datetime is read as UTC (as protobuf does)."""
    if value is None:
        return None
    t = timestamp_pb2.Timestamp()
    t.FromDatetime(value)
    return t


def _canonicalization(value: Canonicalization | str) -> str:
    """The proto enum's name (protobuf takes names as well as numbers)."""
    return "CANONICALIZATION_" + Canonicalization(value).value


def _status(value: Status | str) -> str:
    status = Status[value.upper().removeprefix("STATUS_")] if isinstance(value, str) else value
    return "STATUS_" + Status(status).name


def _claim_result(r: Any) -> ClaimResult:
    retry_after = r.retry_after.ToTimedelta().total_seconds() if r.HasField("retry_after") else None
    return ClaimResult(Outcome(r.outcome), Entry.from_pb(r.entry), r.claim_token, r.note,
                       retry_after)


def _read_file(value: bytes | str | Path) -> bytes:
    return value if isinstance(value, bytes) else Path(value).read_bytes()


class _Base:
    """What both clients share: configuration, requests, and run_once's decisions."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None,
        root_certificates: bytes | str | Path | None,
        tls: bool | None,
        timeout: float,
        principal: str,
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.principal = principal
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        secure = tls if tls is not None else root_certificates is not None
        self._credentials = (
            grpc.ssl_channel_credentials(
                _read_file(root_certificates) if root_certificates is not None else None
            )
            if secure
            else None
        )

    def _deadline(self, timeout: float | None, wait: Seconds | None = None) -> float:
        if timeout is not None:
            return timeout
        waiting = _seconds(wait) or 0.0
        return max(self.timeout, waiting + 1.0) if waiting else self.timeout

    def _claim_request(
        self,
        run_id: str,
        tool: str,
        arguments: Arguments,
        *,
        key: str | None,
        canonicalization: Canonicalization | str,
        lease: Seconds | None,
        retention: Seconds | None,
        wait: Seconds | None,
        principal: str | None,
    ) -> Any:
        return pb.ClaimRequest(
            run_id=run_id or "",
            tool=tool,
            arguments_json=arguments_json(arguments),
            key=key or "",
            canonicalization=_canonicalization(canonicalization),
            lease=_duration(lease),
            retention=_duration(retention),
            wait=_duration(wait) if _seconds(wait) else None,
            principal=self.principal if principal is None else principal,
        )

    @staticmethod
    def _complete_request(
        key: str, claim_token: str, status: Status | str, result: bytes, error: str,
        retryable: bool,
    ) -> Any:
        return pb.CompleteRequest(key=key, claim_token=claim_token, status=_status(status),
                                  result=result, error=error, retryable=retryable)

    @staticmethod
    def _lookup_request(
        key: str | None, run_id: str | None, tool: str | None, arguments: Arguments | None,
        canonicalization: Canonicalization | str,
    ) -> Any:
        if key:
            return pb.LookupRequest(key=key)
        if run_id is None or tool is None or arguments is None:
            raise TypeError("lookup needs key, or run_id, tool and arguments")
        return pb.LookupRequest(run_id=run_id, tool=tool, arguments_json=arguments_json(arguments),
                                canonicalization=_canonicalization(canonicalization))

    @staticmethod
    def _reconcile_request(
        older_than: Seconds | None, tool: str, limit: int, resolutions: Iterable[Resolution],
    ) -> Any:
        return pb.ReconcileRequest(
            older_than=_duration(older_than),
            tool=tool,
            limit=limit,
            resolutions=[
                pb.Resolution(key=r.key, status=_status(r.status), result=r.result,
                              error=r.error, retryable=r.retryable)
                for r in resolutions
            ],
        )

    @staticmethod
    def _list_request(
        run_id: str, tool: str, status: Status | str | None, started_after: datetime | None,
        started_before: datetime | None, page_size: int,
    ) -> Any:
        return pb.ListEntriesRequest(
            run_id=run_id,
            tool=tool,
            status=_status(status) if status is not None else "STATUS_UNSPECIFIED",
            started_after=_timestamp(started_after),
            started_before=_timestamp(started_before),
            page_size=page_size,
        )

    @staticmethod
    def _next_page(request: Any, response: Any) -> bool:
        """Moves `request` to the page after `response`; False after the last page."""
        token = response.next_page_token
        if not token:
            return False
        if token == request.page_token:
            # A server that hands out the same token again would page forever.
            raise RuntimeError("the ledger answered the same page token twice")
        request.page_token = token
        return True

    @staticmethod
    def _settled(claim: ClaimResult, codec: Codec) -> Result[Any]:
        """run_once's answer for every outcome but CLAIMED: a replay, or a typed error."""
        if claim.outcome == Outcome.REPLAYED:
            return Result(codec.decode(claim.entry.result), True, claim.note, claim.entry)
        if claim.outcome == Outcome.PREVIOUSLY_FAILED:
            raise PreviouslyFailedError(claim.note, claim.entry)
        if claim.outcome == Outcome.IN_PROGRESS:
            cls = OutcomeUnknownError if claim.entry.status == Status.UNKNOWN else InProgressError
            raise cls(claim.note, claim.entry, claim.retry_after)
        raise InProgressError(f"unexpected claim outcome {claim.outcome!r}", claim.entry,
                              claim.retry_after)

    @staticmethod
    def _failure(exc: BaseException) -> tuple[Status, str, bool]:
        """How a failed action is recorded: (status, error, retryable)."""
        text = f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
        if isinstance(exc, NotExecuted):
            return Status.FAILED, text, True
        if isinstance(exc, PermanentFailure):
            return Status.FAILED, text, False
        return Status.UNKNOWN, text, False


class Ledger(_Base):
    """A blocking client of the ledger.

    Args:
        target: ``host:port`` of the server.
        token: the bearer token of your tenant, when the server has credentials.
        root_certificates: PEM roots (bytes or a file path) to verify the server's TLS certificate
            with; giving them turns TLS on.
        tls: TLS with the system's roots when True (and no `root_certificates`); plaintext when
            False or unset without roots.
        timeout: the deadline of every call, in seconds, unless the call sets its own.
        principal: who asks, stored with each claim for the audit trail (a claim may override).
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
        channel: grpc.Channel | None = None,
        options: Iterable[tuple[str, Any]] = (),
    ) -> None:
        super().__init__(target, token=token, root_certificates=root_certificates, tls=tls,
                         timeout=timeout, principal=principal)
        if channel is None:
            channel = (
                grpc.secure_channel(target, self._credentials, options=list(options))
                if self._credentials
                else grpc.insecure_channel(target, options=list(options))
            )
        self._channel = channel
        self._stub = pb_grpc.LedgerServiceStub(channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Any, timeout: float) -> Any:
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from e

    # --- the RPCs -----------------------------------------------------------------------------

    def claim(
        self,
        run_id: str,
        tool: str,
        arguments: Arguments,
        *,
        key: str | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        lease: Seconds | None = None,
        retention: Seconds | None = None,
        wait: Seconds | None = None,
        principal: str | None = None,
        timeout: float | None = None,
    ) -> ClaimResult:
        """Claims the key of a tool call before acting. `arguments` is JSON text or a Python
        object (see :mod:`idempotency_ledger.keys`); `key` replaces the derived key with yours.
        Durations are seconds or ``timedelta``; unset means the server's default."""
        request = self._claim_request(run_id, tool, arguments, key=key,
                                      canonicalization=canonicalization, lease=lease,
                                      retention=retention, wait=wait, principal=principal)
        return _claim_result(self._call(self._stub.Claim, request, self._deadline(timeout, wait)))

    def complete(
        self,
        key: str,
        claim_token: str,
        status: Status | str,
        *,
        result: bytes = b"",
        error: str = "",
        retryable: bool = False,
        timeout: float | None = None,
    ) -> Completion:
        """Records what a claimed attempt did: ``SUCCEEDED`` with `result`, ``FAILED`` with
        `error` (and `retryable` when it certainly did not happen), or ``UNKNOWN``."""
        request = self._complete_request(key, claim_token, status, result, error, retryable)
        r = self._call(self._stub.Complete, request, self._deadline(timeout))
        return Completion(Entry.from_pb(r.entry), r.already_completed)

    def lookup(
        self,
        key: str | None = None,
        *,
        run_id: str | None = None,
        tool: str | None = None,
        arguments: Arguments | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        timeout: float | None = None,
    ) -> Entry:
        """The entry of `key`, or of (run_id, tool, arguments) derived as Claim does. Raises
        :class:`NotFound` when there is none."""
        request = self._lookup_request(key, run_id, tool, arguments, canonicalization)
        return Entry.from_pb(self._call(self._stub.Lookup, request, self._deadline(timeout)).entry)

    def reconcile(
        self,
        *,
        older_than: Seconds | None = None,
        tool: str = "",
        limit: int = 0,
        resolutions: Iterable[Resolution] = (),
        timeout: float | None = None,
    ) -> Reconciliation:
        """Sends what the outside world says about entries handed out earlier (`resolutions`)
        and gets up to `limit` unresolved entries started at least `older_than` ago."""
        request = self._reconcile_request(older_than, tool, limit, resolutions)
        r = self._call(self._stub.Reconcile, request, self._deadline(timeout))
        return Reconciliation([Entry.from_pb(e) for e in r.pending],
                              [Entry.from_pb(e) for e in r.resolved])

    def list_entries(
        self,
        *,
        run_id: str = "",
        tool: str = "",
        status: Status | str | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        page_size: int = 100,
        timeout: float | None = None,
    ) -> Iterator[Entry]:
        """Yields the entries of your tenant that match, oldest attempt first (by ``started_at``,
        then key), fetching ``page_size`` at a time (at most 1000) as the iteration goes. Empty
        filters match everything; `started_after` is inclusive, `started_before` exclusive (a
        naive datetime is UTC). `timeout` is the deadline of each page's call. Errors are raised
        by the iteration, not by this call."""
        request = self._list_request(run_id, tool, status, started_after, started_before,
                                     page_size)
        while True:
            r = self._call(self._stub.ListEntries, request, self._deadline(timeout))
            for e in r.entries:
                yield Entry.from_pb(e)
            if not self._next_page(request, r):
                return

    # --- run_once -----------------------------------------------------------------------------

    def run_once(
        self,
        run_id: str,
        tool: str,
        arguments: Arguments,
        action: Callable[[Attempt], Any],
        *,
        codec: Codec = JSON,
        wait: Seconds | None = DEFAULT_WAIT,
        key: str | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        lease: Seconds | None = None,
        retention: Seconds | None = None,
        principal: str | None = None,
        timeout: float | None = None,
    ) -> Result[Any]:
        """Runs ``action(attempt)`` at most once for this intent; see the module's documentation.
        `timeout` is the deadline of each RPC (not of the action)."""
        claim = self.claim(run_id, tool, arguments, key=key, canonicalization=canonicalization,
                           lease=lease, retention=retention, wait=wait, principal=principal,
                           timeout=timeout)
        if claim.outcome != Outcome.CLAIMED:
            return self._settled(claim, codec)
        try:
            payload = codec.encode(action(Attempt(claim.entry, claim.claim_token)))
        except BaseException as exc:
            status, error, retryable = self._failure(exc)
            try:
                completion = self._complete_durably(claim, status, b"", error, retryable, timeout)
            except Exception as complete_error:
                # The entry reads UNKNOWN when its lease ends; the action's error matters more.
                exc.add_note(f"the ledger did not record this failure: {complete_error}")
            else:
                if isinstance(exc, _ActionFailure):
                    exc.entry = completion.entry
            raise
        completion = self._complete_durably(claim, Status.SUCCEEDED, payload, "", False, timeout)
        return Result(codec.decode(payload), False, "", completion.entry)

    def _complete_durably(
        self, claim: ClaimResult, status: Status, result: bytes, error: str, retryable: bool,
        timeout: float | None,
    ) -> Completion:
        for attempt in range(_COMPLETE_TRIES):
            try:
                return self.complete(claim.key, claim.claim_token, status, result=result,
                                     error=error, retryable=retryable, timeout=timeout)
            except (Unavailable, DeadlineExceeded) as e:
                if attempt + 1 == _COMPLETE_TRIES:
                    raise
                time.sleep(e.retry_after or _COMPLETE_BACKOFF * 2**attempt)
        raise AssertionError("unreachable")


class AsyncLedger(_Base):
    """The asyncio client (``grpc.aio``): the same methods as :class:`Ledger`, as coroutines.
    Create it inside the running event loop (``async with AsyncLedger(...) as ledger:``).
    ``run_once``'s action may be a plain function or return an awaitable."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | str | Path | None = None,
        tls: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        principal: str = "",
        channel: grpc.aio.Channel | None = None,
        options: Iterable[tuple[str, Any]] = (),
    ) -> None:
        super().__init__(target, token=token, root_certificates=root_certificates, tls=tls,
                         timeout=timeout, principal=principal)
        if channel is None:
            channel = (
                grpc.aio.secure_channel(target, self._credentials, options=list(options))
                if self._credentials
                else grpc.aio.insecure_channel(target, options=list(options))
            )
        self._channel = channel
        self._stub = pb_grpc.LedgerServiceStub(channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncLedger:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: Callable[..., Any], request: Any, timeout: float) -> Any:
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from e

    async def claim(
        self,
        run_id: str,
        tool: str,
        arguments: Arguments,
        *,
        key: str | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        lease: Seconds | None = None,
        retention: Seconds | None = None,
        wait: Seconds | None = None,
        principal: str | None = None,
        timeout: float | None = None,
    ) -> ClaimResult:
        """See :meth:`Ledger.claim`."""
        request = self._claim_request(run_id, tool, arguments, key=key,
                                      canonicalization=canonicalization, lease=lease,
                                      retention=retention, wait=wait, principal=principal)
        r = await self._call(self._stub.Claim, request, self._deadline(timeout, wait))
        return _claim_result(r)

    async def complete(
        self,
        key: str,
        claim_token: str,
        status: Status | str,
        *,
        result: bytes = b"",
        error: str = "",
        retryable: bool = False,
        timeout: float | None = None,
    ) -> Completion:
        """See :meth:`Ledger.complete`."""
        request = self._complete_request(key, claim_token, status, result, error, retryable)
        r = await self._call(self._stub.Complete, request, self._deadline(timeout))
        return Completion(Entry.from_pb(r.entry), r.already_completed)

    async def lookup(
        self,
        key: str | None = None,
        *,
        run_id: str | None = None,
        tool: str | None = None,
        arguments: Arguments | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        timeout: float | None = None,
    ) -> Entry:
        """See :meth:`Ledger.lookup`."""
        request = self._lookup_request(key, run_id, tool, arguments, canonicalization)
        r = await self._call(self._stub.Lookup, request, self._deadline(timeout))
        return Entry.from_pb(r.entry)

    async def reconcile(
        self,
        *,
        older_than: Seconds | None = None,
        tool: str = "",
        limit: int = 0,
        resolutions: Iterable[Resolution] = (),
        timeout: float | None = None,
    ) -> Reconciliation:
        """See :meth:`Ledger.reconcile`."""
        request = self._reconcile_request(older_than, tool, limit, resolutions)
        r = await self._call(self._stub.Reconcile, request, self._deadline(timeout))
        return Reconciliation([Entry.from_pb(e) for e in r.pending],
                              [Entry.from_pb(e) for e in r.resolved])

    async def list_entries(
        self,
        *,
        run_id: str = "",
        tool: str = "",
        status: Status | str | None = None,
        started_after: datetime | None = None,
        started_before: datetime | None = None,
        page_size: int = 100,
        timeout: float | None = None,
    ) -> AsyncIterator[Entry]:
        """See :meth:`Ledger.list_entries`: an async iterator (``async for entry in ...``)."""
        request = self._list_request(run_id, tool, status, started_after, started_before,
                                     page_size)
        while True:
            r = await self._call(self._stub.ListEntries, request, self._deadline(timeout))
            for e in r.entries:
                yield Entry.from_pb(e)
            if not self._next_page(request, r):
                return

    async def run_once(
        self,
        run_id: str,
        tool: str,
        arguments: Arguments,
        action: Callable[[Attempt], Any | Awaitable[Any]],
        *,
        codec: Codec = JSON,
        wait: Seconds | None = DEFAULT_WAIT,
        key: str | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        lease: Seconds | None = None,
        retention: Seconds | None = None,
        principal: str | None = None,
        timeout: float | None = None,
    ) -> Result[Any]:
        """See :meth:`Ledger.run_once`. A cancellation of the action is recorded as ``UNKNOWN``
        and re-raised."""
        claim = await self.claim(run_id, tool, arguments, key=key,
                                 canonicalization=canonicalization, lease=lease,
                                 retention=retention, wait=wait, principal=principal,
                                 timeout=timeout)
        if claim.outcome != Outcome.CLAIMED:
            return self._settled(claim, codec)
        try:
            value = action(Attempt(claim.entry, claim.claim_token))
            if inspect.isawaitable(value):
                value = await value
            payload = codec.encode(value)
        except BaseException as exc:
            status, error, retryable = self._failure(exc)
            try:
                # Shielded, so that recording a cancellation is not cancelled in turn.
                completion = await asyncio.shield(
                    self._complete_durably(claim, status, b"", error, retryable, timeout)
                )
            except BaseException as complete_error:
                exc.add_note(f"the ledger did not record this failure: {complete_error!r}")
            else:
                if isinstance(exc, _ActionFailure):
                    exc.entry = completion.entry
            raise
        completion = await self._complete_durably(claim, Status.SUCCEEDED, payload, "", False,
                                                  timeout)
        return Result(codec.decode(payload), False, "", completion.entry)

    async def _complete_durably(
        self, claim: ClaimResult, status: Status, result: bytes, error: str, retryable: bool,
        timeout: float | None,
    ) -> Completion:
        for attempt in range(_COMPLETE_TRIES):
            try:
                return await self.complete(claim.key, claim.claim_token, status, result=result,
                                           error=error, retryable=retryable, timeout=timeout)
            except (Unavailable, DeadlineExceeded) as e:
                if attempt + 1 == _COMPLETE_TRIES:
                    raise
                await asyncio.sleep(e.retry_after or _COMPLETE_BACKOFF * 2**attempt)
        raise AssertionError("unreachable")
