"""The clients' public calls, each written once, and what both clients share.

:class:`Calls` holds every public method of :class:`~idempotency_ledger.client.LedgerClient`
once, with its signature, defaults, type hints and documentation: each builds its request and
hands one of the core's operations (``_core``, ``_run_once``: generators of steps) to
``self._drive``. The blocking client inherits them as they are (its driver runs the steps to
their end); the asyncio client binds each with :func:`awaiting` (or :func:`iterating`, for a
stream), which awaits what its driver returns, so its methods are coroutine functions with the
same parameters. See the ``client`` module for why this design. :class:`Base` is the
configuration and the requests' metadata.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import (  # Awaitable: named by ASYNC_ACTION, for get_type_hints
    AsyncIterator,
    Awaitable,  # noqa: F401
    Callable,
    Coroutine,
    Iterable,
    Iterator,
)
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import grpc

from . import _core as core
from . import _run_once as once
from . import _wire as wire
from ._confirm import check_confirm, confirm_required
from ._trace import trace_metadata
from ._wire import Arguments, Seconds
from .codec import JSON, Codec
from .model import (
    ApprovalEvent,
    Attempt,
    CallOutcome,
    Canonicalization,
    ClaimResult,
    Completion,
    Decision,
    Entry,
    Reconciliation,
    Resolution,
    Result,
    RunExtension,
    Status,
    UnknownAttempt,
)

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


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

Confirm = Callable[[UnknownAttempt], Any]


class Base:
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


class Calls(Base):
    """The public calls of the clients, written once (see the module's documentation)."""

    if TYPE_CHECKING:  # what each client's driver provides
        def _drive(self, steps: core.Steps[T]) -> T: ...

        def _pages(self, request: Callable[[], Any], timeout: float | None,
                   ) -> Iterator[Entry]: ...

        def _watch(self, request: Callable[[], Any]) -> Iterator[ApprovalEvent]: ...

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
        return self._pages(lambda: wire.list_request(run_id, tool, status, started_after,
                                                     started_before, page_size), timeout)

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
        return self._watch(lambda: wire.watch_request(cursor))

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
        call = self._call(run_id, tool, arguments, action, codec=codec, wait=wait, key=key,
                          canonicalization=canonicalization, lease=lease, retention=retention,
                          principal=principal, timeout=timeout, action_timeout=action_timeout,
                          renew=renew, not_executed=not_executed, confirm=confirm,
                          confirm_delay=confirm_delay, require_approval=require_approval)
        return self._drive(once.run_once(self._policy, call))

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
        return self._drive(once.attempt(self._policy, call))



# --- the asyncio client's methods, from the same definitions ----------------------------------

#: The action the asyncio client takes: a plain function, or one that returns an awaitable.
ASYNC_ACTION = "Callable[[Attempt], T | Awaitable[T]]"


def awaiting(method: Callable[Concatenate[Any, P], R], more: str = ".", **annotations: str,
             ) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, R]]:
    """The asyncio client's coroutine method made from `method` of :class:`Calls`: the same
    parameters, defaults and return type (`annotations` replace a parameter's type where the
    asyncio client takes more), documented as ``See LedgerClient.<name>`` and `more`. The
    request is built when the coroutine runs, as an ``async def`` would."""

    @functools.wraps(method)
    async def call(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        return await method(self, *args, **kwargs)  # type: ignore[misc]

    return _present(call, method, more, annotations)


def iterating(method: Callable[Concatenate[Any, P], Iterator[T]], more: str,
              ) -> Callable[Concatenate[Any, P], AsyncIterator[T]]:
    """:func:`awaiting` for a stream: an async generator method (``async for``)."""

    @functools.wraps(method)
    async def stream(self: Any, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        async for item in method(self, *args, **kwargs):  # type: ignore[attr-defined]
            yield item

    return _present(stream, method, more, {"return": f"Async{method.__annotations__['return']}"})


def _present(function: Any, method: Callable[..., Any], more: str,
             annotations: dict[str, str]) -> Any:
    name = method.__name__
    function.__qualname__ = f"AsyncLedgerClient.{name}"
    function.__doc__ = f"See :meth:`LedgerClient.{name}`{more}"
    if annotations:
        function.__annotations__ = {**method.__annotations__, **annotations}
        signature = inspect.signature(method)
        function.__signature__ = signature.replace(
            parameters=[p.replace(annotation=annotations.get(p.name, p.annotation))
                        for p in signature.parameters.values()],
            return_annotation=annotations.get("return", signature.return_annotation))
    return function
