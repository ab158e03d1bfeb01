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

What run_once decides is written once, in ``_core``, for both clients; this module drives it:
with blocking calls and threads here, with awaits and tasks in :class:`AsyncLedgerClient`.

Every RPC has a deadline: the client's `timeout` (10 s unless given), or the call's own
``timeout=``; a claim that waits gets at least its wait plus a second. ``timeout`` never bounds the
action. Claim, Lookup, RenewLease and Complete that meet ``UNAVAILABLE`` are sent again after the
server's ``RetryInfo`` delay within ``retry_budget`` seconds (Complete: at least the lease).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from . import _core as core
from . import _wire as wire
from ._confirm import check_confirm, confirm_required
from ._proto import ledger_pb2_grpc as pb_grpc
from ._trace import trace_metadata
from ._wire import Arguments, Seconds
from .codec import JSON, Codec
from .errors import FailedPrecondition, LedgerError, error_from_rpc
from .model import (
    ApprovalEvent,
    Attempt,
    CallOutcome,
    Canonicalization,
    ClaimResult,
    Completion,
    Decision,
    Entry,
    Outcome,
    Reconciliation,
    Resolution,
    Result,
    RunExtension,
    Status,
    UnknownAttempt,
)

__all__ = ["AsyncLedgerClient", "LedgerClient"]

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
#: How long a call that meets UNAVAILABLE is sent again, by default
#: (``defaults.retry_budget_seconds`` of clients/parity.json): long enough for a failover.
DEFAULT_RETRY_BUDGET = 30.0
#: The pause between an unknown outcome and asking the tool's confirm, by default
#: (``defaults.confirm_delay_seconds``): the external system may need a moment to show it.
DEFAULT_CONFIRM_DELAY = 1.0
# How fast a broken channel tries to connect again. gRPC's default backoff grows to two minutes,
# so a channel broken by a ten-second failover could stay down long after the server is back.
_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 200),
                    ("grpc.max_reconnect_backoff_ms", 2000))

Confirm = Callable[[UnknownAttempt], Any]


def _channel_options(options: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    given = list(options)
    names = {name for name, _ in given}
    return given + [(n, v) for n, v in _CHANNEL_OPTIONS if n not in names]


class _Base:
    """What both clients share: configuration and the requests' metadata."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None,
        root_certificates: bytes | str | Path | None,
        tls: bool | None,
        timeout: float,
        principal: str,
        retry_budget: float,
        require_confirm: bool,
    ) -> None:
        self.target = target
        self.address, scheme_tls = wire.parse_target(target)
        self.timeout = timeout
        self.principal = principal
        self.retry_budget = retry_budget
        #: Strict mode: a tool registered without a ``confirm`` (its paired read) is refused.
        self.require_confirm = require_confirm
        self._policy = core.Policy(
            timeout=timeout, principal=principal, retry_budget=retry_budget,
            settler=principal or core.default_principal("confirm"))
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
                wire.read_file(root_certificates) if root_certificates is not None else None
            )
            if secure
            else None
        )

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The credential, and the caller's trace (``traceparent``) when OpenTelemetry is
        installed and a span is current."""
        return self._metadata + trace_metadata()

    def _call(self, run_id: str, tool: str, arguments: Arguments, action: Callable[[Attempt], Any],
              *, codec: Codec, wait: Seconds | None, key: str | None,
              canonicalization: Canonicalization | str, lease: Seconds | None,
              retention: Seconds | None, principal: str | None, timeout: float | None,
              action_timeout: Seconds | None, renew: bool,
              not_executed: Iterable[type[BaseException]], confirm: Confirm | None,
              confirm_delay: float, require_approval: bool = False,
              claimed: ClaimResult | None = None) -> core.Call:
        if self.require_confirm and confirm is None:
            raise confirm_required(tool)  # refused before anything is claimed
        if confirm is not None:
            check_confirm(confirm, tool)
        return core.Call(run_id=run_id, tool=tool, arguments=arguments, action=action,
                         codec=codec, wait=wait, key=key, canonicalization=canonicalization,
                         lease=lease, retention=retention, principal=principal, timeout=timeout,
                         action_timeout=action_timeout, renew=renew,
                         not_executed=tuple(not_executed), confirm=confirm,
                         confirm_delay=confirm_delay, require_approval=require_approval,
                         claimed=claimed)

    @staticmethod
    def _renew_interval(lease: float) -> float:
        return lease * RENEW_EVERY_FRACTION_OF_LEASE


class LedgerClient(_Base):
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

    # --- the driver of the core's steps -------------------------------------------------------

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
        renewer = _Renewer(self, step.claim, step.timeout) if step.renew else None
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
        require_approval: bool = False,
    ) -> ClaimResult:
        """Claims the key of a tool call before acting. `arguments` is JSON text or a Python
        object (see :mod:`idempotency_ledger.keys`); `key` replaces the derived key with yours.
        Durations are seconds or ``timedelta``; unset means the server's default.
        `require_approval` asks a person first whatever the server's policy says: a new entry
        answers ``Outcome.AWAITING_APPROVAL`` instead of ``CLAIMED``."""
        request = wire.claim_request(
            run_id, tool, arguments, key=key, canonicalization=canonicalization, lease=lease,
            retention=retention, wait=wait,
            principal=self.principal if principal is None else principal,
            require_approval=require_approval)
        return self._drive(core.claim(self._policy, request, timeout, wait))

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
        return self._drive(core.complete(self._policy, key, claim_token, status, result, error,
                                         retryable, timeout))

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
        request = wire.lookup_request(key, run_id, tool, arguments, canonicalization)
        return self._drive(core.lookup(self._policy, request, timeout))

    def reconcile(
        self,
        *,
        older_than: Seconds | None = None,
        tool: str = "",
        limit: int = 0,
        resolutions: Iterable[Resolution] = (),
        resolve_only: bool = False,
        keys: Iterable[str] = (),
        principal: str | None = None,
        timeout: float | None = None,
    ) -> Reconciliation:
        """Sends what the outside world says about entries handed out earlier (`resolutions`)
        and gets up to `limit` unresolved entries started at least `older_than` ago. With
        `resolve_only` it only applies the resolutions: nothing new is handed out or held (a
        worker's last call before it stops). `keys` hands out only those keys (each if it is
        unresolved and no other reconciler holds it); `principal` (default: the client's) is
        recorded as ``resolved_by`` on each entry the call resolves."""
        request = wire.reconcile_request(older_than, tool, limit, resolutions, resolve_only,
                                         keys, self.principal if principal is None else principal)
        return self._drive(core.reconcile(self._policy, request, timeout))

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
        return self._drive(core.renew_lease(self._policy, key, claim_token, lease, timeout))

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
        request = wire.list_request(run_id, tool, status, started_after, started_before,
                                    page_size)
        while True:
            r = self._execute(core.Rpc("ListEntries", request, self._policy.deadline(timeout)))
            for e in r.entries:
                yield Entry.from_pb(e)
            if not wire.next_page(request, r):
                return

    def decide(
        self,
        key: str,
        fingerprint: str,
        decision: Decision | str,
        reason: str = "",
        *,
        timeout: float | None = None,
    ) -> Entry:
        """A person's decision about a call awaiting approval: ``"approve"`` or ``"deny"``,
        with `reason` (the model reads it with a denial). `fingerprint` is the entry's as the
        person was shown it with the arguments: another raises :class:`ApprovalMismatch` and
        changes nothing. Only a credential with the approver role decides (the client's
        `token`): another raises :class:`ApproverRoleRequired`; the server records who decided
        from the credential (``entry.approval.decided_by``). The same decision again returns
        the entry unchanged; the opposite one raises :class:`AlreadyDecided`, and an entry
        that awaits no decision :class:`NotAwaitingApproval`. Returns the entry decided."""
        request = wire.decide_request(key, fingerprint, decision, reason)
        return self._drive(core.decide(self._policy, request, timeout))

    def extend_run(self, run_id: str, at_least: Seconds | None = None, *,
                   timeout: float | None = None) -> RunExtension:
        """Keeps every finished entry of `run_id` at least `at_least` (seconds or
        ``timedelta``; unset: the server's default retention) from now, so that the retries
        after a run paused outside the ledger still replay; never shortens a retention. Above
        the server's ``--max-retention`` raises :class:`InvalidArgument`."""
        request = wire.extend_run_request(run_id, at_least)
        return self._drive(core.extend_run(self._policy, request, timeout))

    def watch_approvals(self, cursor: str | None = None) -> Iterator[ApprovalEvent]:
        """Yields the tenant's approval events as they happen (a request, a decision, a use, an
        expiry), from now, or after `cursor` (the ``cursor`` of the last event seen, to resume
        after a reconnect without missing one). The stream has no deadline; break out of the
        loop (or close the generator) to end it. Errors are raised by the iteration."""
        request = wire.watch_request(cursor)
        stream = self._stub.WatchApprovals(request, metadata=self._call_metadata())
        try:
            for r in stream:
                yield wire.approval_event(r)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from e
        finally:
            stream.cancel()

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
        not_executed: Iterable[type[BaseException]] = (),
        confirm: Confirm | None = None,
        confirm_delay: float = DEFAULT_CONFIRM_DELAY,
        require_approval: bool = False,
    ) -> Result[T]:
        """Runs ``action(attempt)`` at most once for this intent; see the module's documentation.

        `timeout` is the deadline of each RPC, not of the action. `action_timeout` (seconds)
        bounds the action: when it has not returned by then, the entry is completed ``UNKNOWN``
        and :class:`ActionTimeout` is raised. A blocking function cannot be interrupted, so it
        then runs on in its thread; should it still return, its outcome is completed late (a
        Complete with the same token settles an ``UNKNOWN`` entry nobody resolved yet). While the
        action runs, the lease is renewed every third of it unless `renew` is False.
        `not_executed`: exception classes the action raises only before acting (recorded
        ``FAILED``, retryable). `confirm`: the tool's paired read, asked `confirm_delay` seconds
        after an unknown outcome (and before a repeat answers one whose lease ended)."""
        return core.result_of(self.attempt(
            run_id, tool, arguments, action, codec=codec, wait=wait, key=key,
            canonicalization=canonicalization, lease=lease, retention=retention,
            principal=principal, timeout=timeout, action_timeout=action_timeout, renew=renew,
            not_executed=not_executed, confirm=confirm, confirm_delay=confirm_delay,
            require_approval=require_approval))

    def attempt(
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
        not_executed: Iterable[type[BaseException]] = (),
        confirm: Confirm | None = None,
        confirm_delay: float = DEFAULT_CONFIRM_DELAY,
        require_approval: bool = False,
        claimed: ClaimResult | None = None,
    ) -> CallOutcome[T]:
        """:meth:`run_once` without raising for an outcome: what became of the call
        (:class:`~idempotency_ledger.CallOutcome`). A call the ledger refuses or cannot be reached
        for still raises its :class:`LedgerError`. `claimed`: a claim of this call's key already
        won (``CLAIMED``), acted on instead of claiming again."""
        call = self._call(run_id, tool, arguments, action, codec=codec, wait=wait, key=key,
                          canonicalization=canonicalization, lease=lease, retention=retention,
                          principal=principal, timeout=timeout, action_timeout=action_timeout,
                          renew=renew, not_executed=not_executed, confirm=confirm,
                          confirm_delay=confirm_delay, require_approval=require_approval,
                          claimed=claimed)
        return self._drive(core.attempt(self._policy, call))


class _Renewer:
    """Renews the lease of a blocking run_once's attempt from a thread of its own while the
    action runs. A renewal that fails for a passing reason is sent again until the next tick,
    and tried at the next tick after that; one the server refuses for good (LEASE_ENDED,
    STALE_CLAIM_TOKEN) ends the renewals."""

    def __init__(self, ledger: LedgerClient, claim: ClaimResult, timeout: float | None) -> None:
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
        interval = _Base._renew_interval(self._lease)
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


class AsyncLedgerClient(_Base):
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

    # --- the driver of the core's steps -------------------------------------------------------

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
        release = asyncio.ensure_future(self._drive(core.release(self._policy, claimed)))
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

    # --- the RPCs -----------------------------------------------------------------------------

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
        require_approval: bool = False,
    ) -> ClaimResult:
        """See :meth:`LedgerClient.claim`."""
        request = wire.claim_request(
            run_id, tool, arguments, key=key, canonicalization=canonicalization, lease=lease,
            retention=retention, wait=wait,
            principal=self.principal if principal is None else principal,
            require_approval=require_approval)
        return await self._drive(core.claim(self._policy, request, timeout, wait))

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
        """See :meth:`LedgerClient.complete`."""
        return await self._drive(core.complete(self._policy, key, claim_token, status, result,
                                               error, retryable, timeout))

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
        """See :meth:`LedgerClient.lookup`."""
        request = wire.lookup_request(key, run_id, tool, arguments, canonicalization)
        return await self._drive(core.lookup(self._policy, request, timeout))

    async def reconcile(
        self,
        *,
        older_than: Seconds | None = None,
        tool: str = "",
        limit: int = 0,
        resolutions: Iterable[Resolution] = (),
        resolve_only: bool = False,
        keys: Iterable[str] = (),
        principal: str | None = None,
        timeout: float | None = None,
    ) -> Reconciliation:
        """See :meth:`LedgerClient.reconcile`."""
        request = wire.reconcile_request(older_than, tool, limit, resolutions, resolve_only,
                                         keys, self.principal if principal is None else principal)
        return await self._drive(core.reconcile(self._policy, request, timeout))

    async def renew_lease(
        self,
        key: str,
        claim_token: str,
        lease: Seconds | None = None,
        *,
        timeout: float | None = None,
    ) -> Entry:
        """See :meth:`LedgerClient.renew_lease`."""
        return await self._drive(core.renew_lease(self._policy, key, claim_token, lease,
                                                  timeout))

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
        """See :meth:`LedgerClient.list_entries`: an async iterator (``async for entry in
        ...``)."""
        request = wire.list_request(run_id, tool, status, started_after, started_before,
                                    page_size)
        while True:
            r = await self._rpc(core.Rpc("ListEntries", request, self._policy.deadline(timeout)))
            for e in r.entries:
                yield Entry.from_pb(e)
            if not wire.next_page(request, r):
                return

    async def decide(
        self,
        key: str,
        fingerprint: str,
        decision: Decision | str,
        reason: str = "",
        *,
        timeout: float | None = None,
    ) -> Entry:
        """See :meth:`LedgerClient.decide`."""
        request = wire.decide_request(key, fingerprint, decision, reason)
        return await self._drive(core.decide(self._policy, request, timeout))

    async def extend_run(self, run_id: str, at_least: Seconds | None = None, *,
                         timeout: float | None = None) -> RunExtension:
        """See :meth:`LedgerClient.extend_run`."""
        request = wire.extend_run_request(run_id, at_least)
        return await self._drive(core.extend_run(self._policy, request, timeout))

    async def watch_approvals(self, cursor: str | None = None) -> AsyncIterator[ApprovalEvent]:
        """See :meth:`LedgerClient.watch_approvals`: an async iterator (``async for event in
        ...``)."""
        request = wire.watch_request(cursor)
        stream = self._stub.WatchApprovals(request, metadata=self._call_metadata())
        try:
            async for r in stream:
                yield wire.approval_event(r)
        except grpc.aio.AioRpcError as e:
            raise error_from_rpc(e) from e
        finally:
            stream.cancel()

    # --- run_once -----------------------------------------------------------------------------

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
        not_executed: Iterable[type[BaseException]] = (),
        confirm: Confirm | None = None,
        confirm_delay: float = DEFAULT_CONFIRM_DELAY,
        require_approval: bool = False,
    ) -> Result[T]:
        """See :meth:`LedgerClient.run_once`. A cancellation of the action is recorded as
        ``UNKNOWN`` and re-raised. `action_timeout` cancels the awaitable the action returned
        when it has not finished by then (a plain function that blocks cannot be interrupted:
        give the ``AsyncLedger`` awaitables, or run blocking work with ``asyncio.to_thread``)."""
        return core.result_of(await self.attempt(
            run_id, tool, arguments, action, codec=codec, wait=wait, key=key,
            canonicalization=canonicalization, lease=lease, retention=retention,
            principal=principal, timeout=timeout, action_timeout=action_timeout, renew=renew,
            not_executed=not_executed, confirm=confirm, confirm_delay=confirm_delay,
            require_approval=require_approval))

    async def attempt(
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
        not_executed: Iterable[type[BaseException]] = (),
        confirm: Confirm | None = None,
        confirm_delay: float = DEFAULT_CONFIRM_DELAY,
        require_approval: bool = False,
        claimed: ClaimResult | None = None,
    ) -> CallOutcome[T]:
        """See :meth:`LedgerClient.attempt`."""
        call = self._call(run_id, tool, arguments, action, codec=codec, wait=wait, key=key,
                          canonicalization=canonicalization, lease=lease, retention=retention,
                          principal=principal, timeout=timeout, action_timeout=action_timeout,
                          renew=renew, not_executed=not_executed, confirm=confirm,
                          confirm_delay=confirm_delay, require_approval=require_approval,
                          claimed=claimed)
        return await self._drive(core.attempt(self._policy, call))


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
