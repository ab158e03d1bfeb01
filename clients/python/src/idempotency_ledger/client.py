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

While the action runs, ``run_once`` renews the attempt's lease every third of it (RenewLease), so
a duplicate keeps reading ``IN_PROGRESS`` (``ATTEMPTING``) however slow the action, and stops when
the action ends. ``action_timeout`` bounds the action itself: one that outlives it is recorded
``UNKNOWN`` and :class:`ActionTimeout` is raised.

Every RPC has a deadline: the client's `timeout` (10 s unless given), or the call's own
``timeout=``; a claim that waits gets at least its wait plus a second. ``timeout`` never bounds the
action.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

import grpc
import grpc.aio
from google.protobuf import duration_pb2, timestamp_pb2

from idempotency.v1 import ledger_pb2 as pb
from idempotency.v1 import ledger_pb2_grpc as pb_grpc

from .codec import JSON, Codec
from .errors import (
    ActionTimeout,
    DeadlineExceeded,
    FailedPrecondition,
    InProgressError,
    LedgerError,
    NotExecuted,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    ResultNotEncodable,
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

if TYPE_CHECKING:
    from .tools import AsyncToolDecorator, ToolDecorator

__all__ = ["AsyncLedger", "Ledger"]

Seconds = float | int | timedelta
Arguments = str | Mapping[str, Any]
T = TypeVar("T")

#: The deadline of a call that sets none.
DEFAULT_TIMEOUT = 10.0
#: How long run_once waits, by default, for an attempt of the same intent already in flight
#: (``defaults.wait_seconds`` of clients/parity.json).
DEFAULT_WAIT = 10.0
#: run_once renews the lease of its attempt this often, as a fraction of the lease
#: (``defaults.renew_every_fraction_of_lease`` of clients/parity.json): two renewals can fail
#: before a duplicate could read the attempt as UNKNOWN.
RENEW_EVERY_FRACTION_OF_LEASE = 1 / 3
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


def _parse_target(target: str) -> tuple[str, bool | None]:
    """(the gRPC address, TLS) of ``host:port``, ``http://host[:port]`` (plaintext) or
    ``https://host[:port]`` (TLS), as the TypeScript client and the CLI take them. TLS is ``None``
    for a bare ``host:port``: the other arguments decide."""
    if "://" not in target:
        if not target or "/" in target:
            raise ValueError(f"target {target!r}: expected host:port, http://host:port or "
                             "https://host:port")
        return target, None
    url = urlsplit(target)
    if url.scheme not in ("http", "https"):
        raise ValueError(f"target {target!r}: the scheme must be http:// or https://")
    if not url.hostname or url.path not in ("", "/") or url.query or url.fragment or (
            url.username or url.password):
        raise ValueError(f"target {target!r}: expected {url.scheme}://host:port and nothing more")
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError as e:
        raise ValueError(f"target {target!r}: {e}") from None
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return f"{host}:{port}", url.scheme == "https"


def _check_arity(action: Callable[..., Any]) -> None:
    """Raises (BeforeActing around) TypeError when `action` cannot be called with one attempt,
    before it is called: an action that could not even start certainly did not act."""
    try:
        signature = inspect.signature(action)
    except (TypeError, ValueError):
        return  # a callable without a signature (a builtin): let the call decide
    try:
        signature.bind(None)
    except TypeError as e:
        raise BeforeActing(TypeError(f"run_once calls action(attempt) with one argument, but "
                                     f"{action!r} cannot take it: {e}")) from None


class BeforeActing(Exception):  # noqa: N818 (a wrapper, not an error of its own)
    """Raised by an action's own set-up code, before it could have acted, around the real error:
    ``run_once`` records the attempt ``FAILED`` and retryable (not ``UNKNOWN``) and re-raises the
    real error. The tool wrapper uses it for its own failures."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _action_failure(exc: BaseException) -> _ActionFailure | None:
    """The NotExecuted or PermanentFailure that `exc` is, or was raised from (``raise ... from``):
    a framework that wraps a tool's exception (FastMCP's ToolError) does not change what it
    said."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, _ActionFailure):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


def _granted_lease(claim: ClaimResult) -> float | None:
    """The lease the server granted the claim, in seconds (the claim's own, or the server's
    default), which renewals ask for again."""
    entry = claim.entry
    if entry.lease_expires_at is None or entry.started_at is None:
        return None
    seconds = (entry.lease_expires_at - entry.started_at).total_seconds()
    return seconds if seconds > 0 else None


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
        self.address, scheme_tls = _parse_target(target)
        self.timeout = timeout
        self.principal = principal
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        if scheme_tls is False and (tls or root_certificates is not None):
            raise ValueError(f"target {target!r} is plaintext (http://) but TLS was asked for: "
                             "use https://")
        if scheme_tls is True and tls is False:
            raise ValueError(f"target {target!r} is TLS (https://) but tls=False")
        if scheme_tls is not None:
            secure = scheme_tls
        else:
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
    def _renew_request(key: str, claim_token: str, lease: Seconds | None) -> Any:
        return pb.RenewLeaseRequest(key=key, claim_token=claim_token, lease=_duration(lease))

    @staticmethod
    def _reconcile_request(
        older_than: Seconds | None, tool: str, limit: int, resolutions: Iterable[Resolution],
        resolve_only: bool,
    ) -> Any:
        return pb.ReconcileRequest(
            older_than=_duration(older_than),
            tool=tool,
            limit=limit,
            resolve_only=resolve_only,
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
        if isinstance(exc, BeforeActing):
            inner = exc.error
            return Status.FAILED, f"{type(inner).__name__}: {inner}"[:_MAX_ERROR_CHARS], True
        failure = _action_failure(exc)
        said = failure if failure is not None else exc
        text = f"{type(said).__name__}: {said}"[:_MAX_ERROR_CHARS]
        if isinstance(failure, NotExecuted):
            return Status.FAILED, text, True
        if isinstance(failure, PermanentFailure):
            return Status.FAILED, text, False
        return Status.UNKNOWN, text, False

    @staticmethod
    def _renew_interval(lease: float) -> float:
        return lease * RENEW_EVERY_FRACTION_OF_LEASE


class Ledger(_Base):
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
                grpc.secure_channel(self.address, self._credentials, options=list(options))
                if self._credentials
                else grpc.insecure_channel(self.address, options=list(options))
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
        resolve_only: bool = False,
        timeout: float | None = None,
    ) -> Reconciliation:
        """Sends what the outside world says about entries handed out earlier (`resolutions`)
        and gets up to `limit` unresolved entries started at least `older_than` ago. With
        `resolve_only` it only applies the resolutions: nothing new is handed out or held (a
        worker's last call before it stops)."""
        request = self._reconcile_request(older_than, tool, limit, resolutions, resolve_only)
        r = self._call(self._stub.Reconcile, request, self._deadline(timeout))
        return Reconciliation([Entry.from_pb(e) for e in r.pending],
                              [Entry.from_pb(e) for e in r.resolved])

    def renew_lease(
        self,
        key: str,
        claim_token: str,
        lease: Seconds | None = None,
        *,
        timeout: float | None = None,
    ) -> Entry:
        """Extends the lease of the attempt you hold to `lease` from now (unset: the server's
        default lease), so a duplicate keeps getting ``IN_PROGRESS`` while a slow action runs.
        ``run_once`` and the tool wrappers do this by themselves. Raises :class:`LeaseEnded` when
        the lease already ended or the entry is resolved (nothing changed),
        :class:`StaleClaimToken` for a token that is not the current claim's."""
        request = self._renew_request(key, claim_token, lease)
        return Entry.from_pb(self._call(self._stub.RenewLease, request,
                                        self._deadline(timeout)).entry)

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
        action: Callable[[Attempt], T],
        *,
        codec: Codec = JSON,
        wait: Seconds | None = DEFAULT_WAIT,
        key: str | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        lease: Seconds | None = None,
        retention: Seconds | None = None,
        principal: str | None = None,
        timeout: float | None = None,
        action_timeout: Seconds | None = None,
        renew: bool = True,
    ) -> Result[T]:
        """Runs ``action(attempt)`` at most once for this intent; see the module's documentation.

        `timeout` is the deadline of each RPC, not of the action. `action_timeout` (seconds)
        bounds the action: when it has not returned by then, the entry is completed ``UNKNOWN``
        and :class:`ActionTimeout` is raised. A blocking function cannot be interrupted, so it
        then runs on in its thread; should it still return, its outcome is completed late (a
        Complete with the same token settles an ``UNKNOWN`` entry nobody resolved yet). While the
        action runs, the lease is renewed every third of it unless `renew` is False."""
        claim = self.claim(run_id, tool, arguments, key=key, canonicalization=canonicalization,
                           lease=lease, retention=retention, wait=wait, principal=principal,
                           timeout=timeout)
        if claim.outcome != Outcome.CLAIMED:
            return self._settled(claim, codec)
        attempt = Attempt(claim.entry, claim.claim_token)
        renewer = _Renewer(self, claim, timeout) if renew else None
        try:
            _check_arity(action)
            if renewer is not None:
                renewer.start()
            if action_timeout is None:
                value = action(attempt)
            else:
                value = self._act_within(action, attempt, _seconds(action_timeout) or 0.0,
                                         claim, codec, timeout)
        except ActionTimeout:
            raise  # recorded UNKNOWN already
        except BaseException as exc:
            self._record_failure(claim, exc, timeout)
            if isinstance(exc, BeforeActing):
                raise exc.error from None
            raise
        finally:
            if renewer is not None:
                renewer.stop()
        try:
            payload = codec.encode(value)
        except Exception as exc:
            raise self._not_encodable(claim, exc, timeout) from exc
        completion = self._complete_durably(claim, Status.SUCCEEDED, payload, "", False, timeout)
        return Result(codec.decode(payload), False, "", completion.entry)

    def tool(self, name: str | None = None, **options: Any) -> ToolDecorator:
        """A decorator that makes a tool function run once per intent; see
        :func:`idempotency_ledger.tools.ledger_tool` for the options. The function keeps its
        signature, so a framework builds the same schema from it::

            @ledger.tool(run_id=lambda: current_run)
            def issue_credit(customer: str, amount: int) -> dict: ...
        """
        from .tools import ledger_tool

        return ledger_tool(self, name, **options)

    def _record_failure(self, claim: ClaimResult, exc: BaseException,
                        timeout: float | None) -> Entry | None:
        """Completes the attempt as `exc` says it failed; the entry, or None when the ledger could
        not record it (the entry then reads UNKNOWN when its lease ends)."""
        status, error, retryable = self._failure(exc)
        target = exc.error if isinstance(exc, BeforeActing) else exc
        try:
            completion = self._complete_durably(claim, status, b"", error, retryable, timeout)
        except Exception as complete_error:
            target.add_note(f"the ledger did not record this failure: {complete_error}")
            return None
        failure = _action_failure(target)
        if failure is not None:
            failure.entry = completion.entry
        return completion.entry

    def _not_encodable(self, claim: ClaimResult, exc: Exception,
                       timeout: float | None) -> ResultNotEncodable:
        error = f"ResultNotEncodable: {type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
        try:
            entry = self._complete_durably(claim, Status.UNKNOWN, b"", error, False,
                                           timeout).entry
        except Exception as complete_error:
            exc.add_note(f"the ledger did not record the unknown outcome: {complete_error}")
            entry = None
        return ResultNotEncodable(claim.key, entry, exc)

    def _act_within(self, action: Callable[[Attempt], T], attempt: Attempt, limit: float,
                    claim: ClaimResult, codec: Codec, timeout: float | None) -> T:
        """Runs the action in a thread of its own and waits up to `limit` seconds for it."""
        done = threading.Event()
        recorded = threading.Event()  # the UNKNOWN of a timeout is recorded (or failed to be)
        lock = threading.Lock()
        abandoned = False
        outcome: dict[str, Any] = {}
        context = contextvars.copy_context()  # current_attempt() and the like, in the thread

        def work() -> None:
            try:
                outcome["value"] = context.run(action, attempt)
            except BaseException as e:  # handed to the waiting thread, or recorded late
                outcome["error"] = e
            with lock:
                done.set()
                late = abandoned
            if late:
                recorded.wait()
                self._complete_late(claim, outcome, codec, timeout)

        worker = threading.Thread(target=work, name=f"ledger-action-{claim.key[:12]}",
                                  daemon=True)
        worker.start()
        if not done.wait(limit):
            with lock:
                abandoned = not done.is_set()
            if abandoned:
                try:
                    entry = self._complete_durably(
                        claim, Status.UNKNOWN, b"",
                        f"ActionTimeout: the action did not finish within {limit:g} s", False,
                        timeout).entry
                except Exception:
                    entry = None
                finally:
                    recorded.set()
                raise ActionTimeout(entry, limit)
        if "error" in outcome:
            raise outcome["error"]
        value: T = outcome["value"]
        return value

    def _complete_late(self, claim: ClaimResult, outcome: dict[str, Any], codec: Codec,
                       timeout: float | None) -> None:
        """Records what an abandoned action did after all, if nobody resolved the entry since.
        An exception that does not say it certainly did not act leaves the entry UNKNOWN."""
        try:
            if "error" in outcome:
                status, error, retryable = self._failure(outcome["error"])
                if status != Status.UNKNOWN:
                    self.complete(claim.key, claim.claim_token, status, error=error,
                                  retryable=retryable, timeout=timeout)
            else:
                self.complete(claim.key, claim.claim_token, Status.SUCCEEDED,
                              result=codec.encode(outcome["value"]), timeout=timeout)
        except Exception:  # noqa: S110 (a reconciler settles it; nobody waits for this thread)
            pass

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


class _Renewer:
    """Renews the lease of a blocking run_once's attempt from a thread of its own while the
    action runs. A renewal that fails for a passing reason is tried again at the next tick; one
    the server refuses for good (LEASE_ENDED, STALE_CLAIM_TOKEN) ends the renewals."""

    def __init__(self, ledger: Ledger, claim: ClaimResult, timeout: float | None) -> None:
        self._ledger = ledger
        self._claim = claim
        self._lease = _granted_lease(claim)
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
        interval = _Base._renew_interval(self._lease)
        # A renewal slower than the lease left cannot keep it alive anyway.
        deadline = min(self._ledger._deadline(self._timeout), self._lease)
        while not self._stop.wait(interval):
            try:
                self.renewed = self._ledger.renew_lease(self._claim.key, self._claim.claim_token,
                                                        self._lease, timeout=deadline)
            except FailedPrecondition:
                return
            except (LedgerError, ValueError):  # ValueError: the channel was closed
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


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
                grpc.aio.secure_channel(self.address, self._credentials, options=list(options))
                if self._credentials
                else grpc.aio.insecure_channel(self.address, options=list(options))
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
        resolve_only: bool = False,
        timeout: float | None = None,
    ) -> Reconciliation:
        """See :meth:`Ledger.reconcile`."""
        request = self._reconcile_request(older_than, tool, limit, resolutions, resolve_only)
        r = await self._call(self._stub.Reconcile, request, self._deadline(timeout))
        return Reconciliation([Entry.from_pb(e) for e in r.pending],
                              [Entry.from_pb(e) for e in r.resolved])

    async def renew_lease(
        self,
        key: str,
        claim_token: str,
        lease: Seconds | None = None,
        *,
        timeout: float | None = None,
    ) -> Entry:
        """See :meth:`Ledger.renew_lease`."""
        request = self._renew_request(key, claim_token, lease)
        r = await self._call(self._stub.RenewLease, request, self._deadline(timeout))
        return Entry.from_pb(r.entry)

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
        action: Callable[[Attempt], T | Awaitable[T]],
        *,
        codec: Codec = JSON,
        wait: Seconds | None = DEFAULT_WAIT,
        key: str | None = None,
        canonicalization: Canonicalization | str = Canonicalization.JCS,
        lease: Seconds | None = None,
        retention: Seconds | None = None,
        principal: str | None = None,
        timeout: float | None = None,
        action_timeout: Seconds | None = None,
        renew: bool = True,
    ) -> Result[T]:
        """See :meth:`Ledger.run_once`. A cancellation of the action is recorded as ``UNKNOWN``
        and re-raised. `action_timeout` cancels the awaitable the action returned when it has not
        finished by then (a plain function that blocks cannot be interrupted: give the
        ``AsyncLedger`` awaitables, or run blocking work with ``asyncio.to_thread``)."""
        claiming = asyncio.ensure_future(self.claim(
            run_id, tool, arguments, key=key, canonicalization=canonicalization, lease=lease,
            retention=retention, wait=wait, principal=principal, timeout=timeout))
        try:
            claim = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            # Cancelled while claiming (a framework cancels the sibling tool calls of one that
            # failed): the server may still grant the claim, and nobody would complete it; it
            # would read UNKNOWN when its lease ends. Release it as not executed instead.
            self._background.add(claiming)
            claiming.add_done_callback(self._background.discard)
            claiming.add_done_callback(self._release_if_claimed)
            raise
        if claim.outcome != Outcome.CLAIMED:
            return self._settled(claim, codec)
        attempt = Attempt(claim.entry, claim.claim_token)
        limit = _seconds(action_timeout)
        renewer = asyncio.create_task(self._renew(claim, timeout)) if renew else None
        timed_out = False
        try:
            _check_arity(action)
            value = action(attempt)
            if inspect.isawaitable(value):
                if limit is None:
                    value = await value
                else:
                    try:
                        async with asyncio.timeout(limit) as scope:
                            value = await value
                    except TimeoutError:
                        if scope.expired():
                            timed_out = True
                        raise
        except BaseException as exc:
            if renewer is not None:
                await _cancel(renewer)
            if timed_out:
                entry = await self._record_unknown(
                    claim, f"ActionTimeout: the action did not finish within {limit:g} s",
                    timeout)
                raise ActionTimeout(entry, limit or 0.0) from exc
            await self._record_failure(claim, exc, timeout)
            if isinstance(exc, BeforeActing):
                raise exc.error from None
            raise
        if renewer is not None:
            await _cancel(renewer)
        try:
            payload = codec.encode(value)
        except Exception as exc:
            error = f"ResultNotEncodable: {type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
            entry = await self._record_unknown(claim, error, timeout, exc)
            raise ResultNotEncodable(claim.key, entry, exc) from exc
        completion = await self._complete_durably(claim, Status.SUCCEEDED, payload, "", False,
                                                  timeout)
        return Result(codec.decode(payload), False, "", completion.entry)

    def tool(self, name: str | None = None, **options: Any) -> AsyncToolDecorator:
        """See :meth:`Ledger.tool`: the wrapped function is a coroutine function (a plain one
        runs in a thread, with ``asyncio.to_thread``)."""
        from .tools import ledger_tool

        return ledger_tool(self, name, **options)

    def _release_if_claimed(self, claiming: asyncio.Future[ClaimResult]) -> None:
        if claiming.cancelled() or claiming.exception() is not None:
            return
        claim = claiming.result()
        if claim.outcome != Outcome.CLAIMED:
            return
        release = asyncio.ensure_future(self._complete_durably(
            claim, Status.FAILED, b"", "CancelledError: cancelled while claiming, before acting",
            True, None))
        self._background.add(release)
        release.add_done_callback(self._background.discard)
        release.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _renew(self, claim: ClaimResult, timeout: float | None) -> None:
        """Renews the attempt's lease every third of it until cancelled; see :class:`_Renewer`."""
        lease = _granted_lease(claim)
        if lease is None:
            return
        interval = self._renew_interval(lease)
        deadline = min(self._deadline(timeout), lease)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew_lease(claim.key, claim.claim_token, lease, timeout=deadline)
            except FailedPrecondition:
                return
            except LedgerError:
                continue

    async def _record_failure(self, claim: ClaimResult, exc: BaseException,
                              timeout: float | None) -> Entry | None:
        """See :meth:`Ledger._record_failure`."""
        status, error, retryable = self._failure(exc)
        target = exc.error if isinstance(exc, BeforeActing) else exc
        try:
            # Shielded, so that recording a cancellation is not cancelled in turn.
            completion = await asyncio.shield(
                self._complete_durably(claim, status, b"", error, retryable, timeout)
            )
        except BaseException as complete_error:
            target.add_note(f"the ledger did not record this failure: {complete_error!r}")
            return None
        failure = _action_failure(target)
        if failure is not None:
            failure.entry = completion.entry
        return completion.entry

    async def _record_unknown(self, claim: ClaimResult, error: str, timeout: float | None,
                              exc: BaseException | None = None) -> Entry | None:
        try:
            completion = await asyncio.shield(
                self._complete_durably(claim, Status.UNKNOWN, b"", error[:_MAX_ERROR_CHARS],
                                       False, timeout))
        except BaseException as complete_error:
            if exc is not None:
                exc.add_note(f"the ledger did not record the unknown outcome: {complete_error!r}")
            return None
        return completion.entry

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


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancels a helper task and waits for it to end. asyncio.wait raises only when the caller
    itself is cancelled meanwhile, never with the helper's own cancellation."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: the renewer's failures end it and change nothing
