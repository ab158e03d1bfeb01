"""What run_once decides, written once for both clients (sans I/O).

Each operation here is a generator that *yields steps* (:class:`Rpc`: a call to send;
:class:`Sleep`: a pause; :class:`Act`: run the action; :class:`StopRenewing`: end the lease
renewals an action that failed left running; :class:`Ask`: ask a tool's ``confirm``;
:class:`ReleaseLate`: let an abandoned action complete late) and *receives* their results, or
has their exceptions thrown in. :class:`~idempotency_ledger.Ledger` drives the generators with
blocking calls and threads, :class:`~idempotency_ledger.AsyncLedger` with awaits and tasks. So
how a failure is recorded, when a call is sent again, and how an unknown outcome is settled is
written once, as httpx and httpcore share h11's sans-I/O core: the drivers own only how to wait.

The RPCs that may be repeated without changing what they mean (Claim, Lookup, RenewLease,
Complete) are sent again after ``UNAVAILABLE``, after the server's ``RetryInfo`` delay (jittered),
within a budget of time: a failover of the ledger's database changes no outcome.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import random
import re
import socket
import time
from collections.abc import Callable, Generator, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from . import _wire as wire
from ._confirm import log_settlement, log_unapplied, said
from .codec import Codec
from .errors import (
    UNKNOWN_NOTE,
    ActionStopped,
    ActionTimeout,
    AlreadyResolved,
    AwaitingApprovalError,
    BeforeActing,
    DeadlineExceeded,
    DeniedError,
    InProgressError,
    InvalidArgument,
    LedgerError,
    NotExecuted,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    ResultNotEncodable,
    Unavailable,
    _ActionFailure,
)
from .keys import arguments_json
from .model import (
    Answer,
    Attempt,
    CallOutcome,
    Canonicalization,
    ClaimResult,
    Completion,
    Confirmation,
    Entry,
    Kind,
    Outcome,
    Reconciliation,
    Resolution,
    Result,
    Status,
    UnknownAttempt,
)

T = TypeVar("T")
log = logging.getLogger("idempotency_ledger")

#: The longest error text stored for a failed action.
MAX_ERROR_CHARS = 4096
#: What the model reads when an unknown outcome was settled as "did not happen".
NOT_PERFORMED_NOTE = ("This action did not take effect: its outcome was unknown, and a check "
                      "found that nothing happened. No action was taken; it may be called again.")
# The pause before a retry that got no RetryInfo (an unreachable server): doubled each time.
_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 2.0
# Lookups of an entry another caller is settling: the first pause, doubled up to the last
# (``settling_poll_seconds`` of clients/parity.json).
_SETTLING_POLL = (0.05, 1.0)


def default_principal(role: str) -> str:
    """Who settles when nobody said: the role, the host and the process (``confirm@host:pid``,
    ``reconciler@host:pid``), recorded as ``resolved_by`` so that an operator can tell which
    worker settled what; the TypeScript client's default too (clients/parity.json)."""
    return re.sub(r"[\x00-\x1f\x7f]", "", f"{role}@{socket.gethostname()}:{os.getpid()}")[:256]


# --- steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rpc:
    """Send ``method`` (the service's method name) with `request` and this deadline; the result
    is the response message, or the call's :class:`LedgerError` thrown in."""

    method: str
    request: Any
    timeout: float


@dataclass(frozen=True)
class Sleep:
    """Pause for `seconds`."""

    seconds: float


@dataclass(frozen=True)
class Act:
    """Run ``action(attempt)``, renewing the claim's lease meanwhile unless `renew` is False,
    for at most `limit` seconds when given; the result is an :class:`Acted`. `late` makes the
    generator that records what an action abandoned at its limit did after all (the blocking
    client cannot interrupt a function). With `hold`, an action that raised an ``Exception`` or
    outlived its limit leaves the renewals running (``Acted.renewal``), for the tool's
    ``confirm`` to be asked under the claim; the core ends them with :class:`StopRenewing`."""

    action: Callable[[Attempt], Any]
    attempt: Attempt
    claim: ClaimResult
    limit: float | None
    renew: bool
    timeout: float | None
    late: Callable[[Acted], Generator[Any, Any, None]]
    hold: bool = False


@dataclass
class Acted:
    """What an action did: returned `value`, raised `error`, or outlived its limit."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    #: With `timed_out`, the driver's handle for :class:`ReleaseLate`.
    late: Any = None
    #: With ``Act.hold``, the lease renewals left running: the handle for :class:`StopRenewing`.
    renewal: Any = None


@dataclass(frozen=True)
class Ask:
    """Call ``confirm(question)`` (awaiting what it returns if it is awaitable); the result is
    its answer, or its exception thrown in."""

    confirm: Callable[[UnknownAttempt], Any]
    question: UnknownAttempt


@dataclass(frozen=True)
class StopRenewing:
    """End the lease renewals an :class:`Act` with ``hold`` left running (`handle`), waiting out
    one in flight, so that none lands after the Complete that follows."""

    handle: Any


@dataclass(frozen=True)
class ReleaseLate:
    """The unknown outcome of an abandoned action is recorded: its late completion may go."""

    handle: Any


Step = Rpc | Sleep | Act | StopRenewing | Ask | ReleaseLate
Steps = Generator[Step, Any, T]


# --- configuration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """What a client was configured with, as the core needs it."""

    #: The deadline of a call that sets none, in seconds.
    timeout: float
    #: Stored with each claim (a claim may override it).
    principal: str
    #: How long, in seconds, a call that meets UNAVAILABLE is sent again (Complete: at least
    #: the lease).
    retry_budget: float
    #: Recorded as ``resolved_by`` on the entries a repeat settles with the tool's ``confirm``
    #: when the call names no principal: the client's principal, else
    #: ``default_principal("confirm")``.
    settler: str
    #: Draws the jitter of the pauses between retries (a parameter, so tests can seed it).
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def deadline(self, timeout: float | None, wait: wire.Seconds | None = None) -> float:
        if timeout is not None:
            return timeout
        waiting = wire.seconds(wait) or 0.0
        return max(self.timeout, waiting + 1.0) if waiting else self.timeout


@dataclass(frozen=True)
class Call:
    """One call of run_once (or ``attempt``), as given."""

    run_id: str
    tool: str
    arguments: wire.Arguments
    action: Callable[[Attempt], Any]
    codec: Codec
    wait: wire.Seconds | None
    key: str | None
    canonicalization: Canonicalization | str
    lease: wire.Seconds | None
    retention: wire.Seconds | None
    principal: str | None
    timeout: float | None
    action_timeout: wire.Seconds | None
    renew: bool
    not_executed: tuple[type[BaseException], ...] = ()
    confirm: Callable[[UnknownAttempt], Any] | None = None
    confirm_delay: float = 1.0
    #: Ask a person first, whatever the server's policy says (``ClaimRequest.require_approval``).
    require_approval: bool = False
    #: A claim already won for this call (an adapter's approval check claimed it): acted on
    #: instead of claiming again.
    claimed: ClaimResult | None = None


# --- the RPCs, sent again where that is safe --------------------------------------------------


def retry_delay(policy: Policy, error: LedgerError, tries: int) -> float:
    """The pause before sending a call again: at least the server's RetryInfo delay, up to half
    as long again at random (so that many clients do not come back at once); without one, a
    doubling backoff, jittered the same way."""
    base = error.retry_after if error.retry_after else min(_FIRST_BACKOFF * 2**tries, _MAX_BACKOFF)
    return base * policy.rng.uniform(1.0, 1.5)


def rpc(policy: Policy, method: str, request: Any, timeout: float, *, budget: float,
        also: tuple[type[LedgerError], ...] = ()) -> Steps[Any]:
    """Sends one call; after ``UNAVAILABLE`` (and the classes in `also`) sends it again after
    :func:`retry_delay` as long as the time spent stays within `budget` seconds."""
    started = time.monotonic()
    tries = 0
    while True:
        try:
            return (yield Rpc(method, request, timeout))
        except (Unavailable, *also) as e:
            delay = retry_delay(policy, e, tries)
            if time.monotonic() - started + delay > budget:
                raise
            tries += 1
            log.info("ledger %s: %s; sending it again in %.2f s", method, e, delay)
            yield Sleep(delay)


def claim(policy: Policy, request: Any, timeout: float | None,
          wait: wire.Seconds | None) -> Steps[ClaimResult]:
    r = yield from rpc(policy, "Claim", request, policy.deadline(timeout, wait),
                       budget=policy.retry_budget)
    return wire.claim_result(r)


def complete(policy: Policy, key: str, claim_token: str, status: Status | str, result: bytes,
             error: str, retryable: bool, timeout: float | None, *, budget: float | None = None,
             also: tuple[type[LedgerError], ...] = ()) -> Steps[Completion]:
    request = wire.complete_request(key, claim_token, status, result, error, retryable)
    r = yield from rpc(policy, "Complete", request, policy.deadline(timeout),
                       budget=policy.retry_budget if budget is None else budget, also=also)
    return wire.completion(r)


def lookup(policy: Policy, request: Any, timeout: float | None) -> Steps[Entry]:
    r = yield from rpc(policy, "Lookup", request, policy.deadline(timeout),
                       budget=policy.retry_budget)
    return wire.entry(r)


def renew_lease(policy: Policy, key: str, claim_token: str, lease: wire.Seconds | None,
                timeout: float | None, *, budget: float | None = None) -> Steps[Entry]:
    r = yield from rpc(policy, "RenewLease", wire.renew_request(key, claim_token, lease),
                       policy.deadline(timeout),
                       budget=policy.retry_budget if budget is None else budget)
    return wire.entry(r)


def reconcile(policy: Policy, request: Any, timeout: float | None, *,
              budget: float = 0.0) -> Steps[Reconciliation]:
    r = yield from rpc(policy, "Reconcile", request, policy.deadline(timeout), budget=budget)
    return wire.reconciliation(r)


def decide(policy: Policy, request: Any, timeout: float | None) -> Steps[Entry]:
    # Sent again after UNAVAILABLE: the same decision again is a success that changes nothing.
    r = yield from rpc(policy, "Decide", request, policy.deadline(timeout),
                       budget=policy.retry_budget)
    return wire.entry(r)


def extend_run(policy: Policy, request: Any, timeout: float | None) -> Steps[Any]:
    # Never shortens a retention: sending it again changes nothing more.
    r = yield from rpc(policy, "ExtendRun", request, policy.deadline(timeout),
                       budget=policy.retry_budget)
    return wire.run_extension(r)


# --- run_once ---------------------------------------------------------------------------------


def attempt(policy: Policy, call: Call) -> Steps[CallOutcome[Any]]:
    """Claims, acts if the claim is won, records what happened, settles an unknown outcome with
    the tool's ``confirm``; returns what became of the call, never raising for an outcome (a
    call the ledger refuses, or that cannot reach it, raises its :class:`LedgerError`)."""
    request = wire.claim_request(
        call.run_id, call.tool, call.arguments, key=call.key,
        canonicalization=call.canonicalization, lease=call.lease, retention=call.retention,
        wait=call.wait, principal=policy.principal if call.principal is None else call.principal,
        require_approval=call.require_approval)
    if call.claimed is not None and call.claimed.outcome == Outcome.CLAIMED:
        claimed = call.claimed
    else:
        claimed = yield from claim_waiting_for_attempts(policy, request, call)
    if claimed.outcome == Outcome.CLAIMED:
        return (yield from _act(policy, call, claimed))
    if (call.confirm is not None and claimed.outcome == Outcome.IN_PROGRESS
            and claimed.entry.status == Status.UNKNOWN):
        # An earlier attempt's outcome is unknown and its lease has ended: settle it with the
        # tool's read first, then claim again, which replays what was found, or acts now if the
        # effect did not happen.
        settled = yield from settle(
            policy, call, claimed.entry,
            pause=pause_since_unknown(claimed.entry, call.confirm_delay))
        if settled is not None and settled.status != Status.UNKNOWN:
            claimed = yield from claim_waiting_for_attempts(policy, request, call)
            if claimed.outcome == Outcome.CLAIMED:
                return (yield from _act(policy, call, claimed))
    return answered(claimed, call.codec)


def claim_waiting_for_attempts(policy: Policy, request: Any, call: Call) -> Steps[ClaimResult]:
    """Claims without waiting first, then, only when an attempt is in flight (``ATTEMPTING``),
    again with the call's `wait`: a call awaiting a person's decision answers at once (a
    waiting claim would wait for the decision, which may take days), while a duplicate of an
    attempt in flight still waits for its result."""
    if not wire.seconds(call.wait):
        return (yield from claim(policy, request, call.timeout, None))
    request.ClearField("wait")
    claimed = yield from claim(policy, request, call.timeout, None)
    if claimed.outcome != Outcome.IN_PROGRESS or claimed.entry.status != Status.ATTEMPTING:
        return claimed
    request.wait.CopyFrom(wire.duration(call.wait))
    return (yield from claim(policy, request, call.timeout, call.wait))


def answered(claimed: ClaimResult, codec: Codec) -> CallOutcome[Any]:
    """What a claim that was not won comes to."""
    entry = claimed.entry
    if claimed.outcome == Outcome.REPLAYED:
        return CallOutcome(Kind.REPLAYED, value=codec.decode(entry.result), note=claimed.note,
                           entry=entry)
    if claimed.outcome == Outcome.PREVIOUSLY_FAILED:
        return CallOutcome(Kind.PREVIOUSLY_FAILED, note=claimed.note, entry=entry,
                           error=PreviouslyFailedError(claimed.note, entry))
    if claimed.outcome == Outcome.AWAITING_APPROVAL:
        return CallOutcome(Kind.AWAITING_APPROVAL, note=claimed.note, entry=entry,
                           error=AwaitingApprovalError(claimed.note, entry))
    if claimed.outcome == Outcome.DENIED:
        return CallOutcome(Kind.DENIED, note=claimed.note, entry=entry,
                           error=DeniedError(claimed.note, entry))
    if claimed.outcome == Outcome.IN_PROGRESS and entry.status == Status.UNKNOWN:
        return CallOutcome(Kind.UNKNOWN, note=claimed.note, entry=entry,
                           error=OutcomeUnknownError(claimed.note, entry, claimed.retry_after),
                           retry_after=claimed.retry_after)
    note = claimed.note if claimed.outcome == Outcome.IN_PROGRESS else (
        f"unexpected claim outcome {claimed.outcome!r}")
    return CallOutcome(Kind.IN_PROGRESS, note=note, entry=entry,
                       error=InProgressError(note, entry, claimed.retry_after),
                       retry_after=claimed.retry_after)


def result_of(outcome: CallOutcome[T]) -> Result[T]:
    """run_once's answer: the :class:`Result`, or the outcome's exception raised."""
    if outcome.kind in (Kind.PERFORMED, Kind.CONFIRMED, Kind.REPLAYED) and outcome.entry:
        return Result(outcome.value, outcome.kind == Kind.REPLAYED,  # type: ignore[arg-type]
                      outcome.note, outcome.entry, confirmed=outcome.kind == Kind.CONFIRMED)
    assert outcome.error is not None
    raise outcome.error


def _act(policy: Policy, call: Call, claimed: ClaimResult) -> Steps[CallOutcome[Any]]:
    arity = arity_error(call.action)
    if arity is not None:  # it could not even start: it certainly did not act
        entry, _ = yield from _record(policy, call, claimed, Status.FAILED, error_text(arity),
                                      True, arity)
        return CallOutcome(Kind.NOT_EXECUTED, entry=entry, error=arity, acted=True)
    limit = wire.seconds(call.action_timeout)
    # With a confirm, a failed action leaves its lease renewals running: the claim is kept
    # while confirm is asked (see _unknown).
    acted = yield Act(call.action, Attempt(claimed.entry, claimed.claim_token), claimed, limit,
                      call.renew, call.timeout,
                      late=lambda late: complete_late(policy, call, claimed, late),
                      hold=call.confirm is not None)
    if acted.timed_out:
        timed_out = ActionTimeout(None, limit or 0.0)
        timed_out.__cause__ = acted.error  # the awaitable's cancellation, when it was one
        outcome = yield from _unknown(
            policy, call, claimed, acted.renewal, timed_out,
            f"ActionTimeout: the action did not finish within {limit:g} s")
        yield ReleaseLate(acted.late)
        return outcome
    if acted.error is not None:
        status, text, retryable, raised = classify(acted.error, call.not_executed)
        if status == Status.UNKNOWN:
            return (yield from _unknown(policy, call, claimed, acted.renewal, raised, text))
        yield from _stop_renewing(acted.renewal)
        entry, _ = yield from _record(policy, call, claimed, status, text, retryable, raised)
        _attach(raised, entry)
        kind = Kind.NOT_EXECUTED if retryable else Kind.FAILED
        return CallOutcome(kind, entry=entry, error=raised, acted=True)
    try:
        payload = call.codec.encode(acted.value)
    except Exception as e:
        entry, _ = yield from _record(policy, call, claimed, Status.UNKNOWN,
                                      f"ResultNotEncodable: {error_text(e)}", False, e)
        unencodable = ResultNotEncodable(claimed.key, entry, e)
        unencodable.__cause__ = e
        return CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=entry, error=unencodable,
                           acted=True)
    try:
        done = yield from _complete_durably(policy, call, claimed, Status.SUCCEEDED, payload, "",
                                            False)
    except InvalidArgument as e:
        # The ledger refused the result (RESULT_TOO_LARGE): the effect happened but cannot be
        # replayed, so record that its outcome is unknown rather than leave the claim hanging
        # until its lease ends (as the TypeScript client does).
        why = f"the ledger refused it: {e.reason or 'INVALID_ARGUMENT'}: {e.message}"
        entry, _ = yield from _record(policy, call, claimed, Status.UNKNOWN,
                                      f"ResultNotEncodable: the result could not be stored: {why}",
                                      False, e)
        refused = ResultNotEncodable(claimed.key, entry, e)
        refused.__cause__ = e
        return CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=entry, error=refused,
                           acted=True)
    except LedgerError as e:
        # It acted, and the ledger could not be told: the entry reads UNKNOWN when its lease
        # ends and waits for a reconciler. Never acted again.
        return CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=None, error=e, acted=True)
    return CallOutcome(Kind.PERFORMED, value=call.codec.decode(payload), entry=done.entry,
                       acted=True)


def _stop_renewing(renewal: Any) -> Steps[None]:
    if renewal is not None:
        yield StopRenewing(renewal)


def _attach(error: BaseException, entry: Entry | None) -> None:
    """Sets the recorded entry on the exception run_once raises (and on the failure the action
    raised it from), as the README promises."""
    if entry is None:
        return
    if isinstance(error, ActionTimeout):
        error.entry = entry  # type: ignore[assignment]
    failure = _action_failure(error)
    if failure is not None:
        failure.entry = entry


def _unknown(policy: Policy, call: Call, claimed: ClaimResult, renewal: Any,
             error: BaseException, text: str) -> Steps[CallOutcome[Any]]:
    """This call's own action left its outcome unknown (it raised once it started, or outlived
    ``action_timeout``). Without a ``confirm`` (or after a cancellation) the entry is completed
    ``UNKNOWN`` at once. With one, the call keeps its claim, its lease still renewed
    (`renewal`), waits ``confirm_delay``, asks ``confirm`` and completes the entry with its own
    claim token as the read found: found → ``SUCCEEDED`` with that result, not found →
    ``FAILED`` retryable (``UNKNOWN`` when the action may still land: :func:`may_still_land`),
    cannot tell → ``UNKNOWN``.

    Keeping the claim, rather than completing ``UNKNOWN`` and taking the entry back with
    ``Reconcile(keys=[key])``, matters twice: a Reconcile hold is anonymous and lasts the
    server's whole reconcile lease (60 s), so a "cannot tell" would lock every repeat's own
    settlement out for that long rather than for the server's reconcile grace; and a duplicate waiting on the claim (the server's wait)
    reads the settled result instead of an unknown outcome. If the process dies meanwhile, the
    renewals stop with it and the entry reads ``UNKNOWN`` when the lease ends, as without a
    confirm."""
    question: UnknownAttempt | None = None
    answer: Any = None
    resolution: Resolution | None = None
    interrupted: BaseException | None = None
    if call.confirm is not None and isinstance(error, Exception):
        entry = claimed.entry
        question = UnknownAttempt(key=claimed.key, external_ref=entry.external_ref,
                                  arguments=json.loads(arguments_json(call.arguments)),
                                  number=entry.attempt, tool=entry.tool, run_id=entry.run_id,
                                  entry=entry)
        try:
            if call.confirm_delay > 0:
                yield Sleep(call.confirm_delay)
            answer = yield from ask(call.confirm, question)
        except BaseException as e:  # cancelled meanwhile: recorded UNKNOWN, then raised
            interrupted = e
        else:
            resolution = resolution_of(answer, question, call.codec, claimed.entry)
    try:
        yield from _stop_renewing(renewal)
    except BaseException as e:  # the Complete below is shielded: it still records the outcome
        interrupted = interrupted or e
    if resolution is None:
        status, result, recorded, retryable = Status.UNKNOWN, b"", text, False
    elif resolution.status == Status.SUCCEEDED:
        status, result, recorded, retryable = Status.SUCCEEDED, resolution.result, "", False
    elif may_still_land(error):
        # The action outlived its time or was stopped: it may still be running, or its request
        # still landing, so "nothing yet" is no proof. Recorded UNKNOWN; a reconciler asks
        # again once the server's reconcile grace has passed (a "found" still settles at once).
        reason = answer.reason if isinstance(answer, Confirmation) else ""
        recorded = (f"{text}; the tool's paired read found no effect yet (external_ref "
                    f"{claimed.entry.external_ref}" + (f": {reason}" if reason else "") +
                    "), but the action may still be running or landing: unknown until a read "
                    "after the ledger's reconcile grace")
        status, result, retryable = Status.UNKNOWN, b"", False
    else:
        reason = answer.reason if isinstance(answer, Confirmation) else ""
        recorded = (f"the attempt failed ({text}) and the tool's paired read found no effect "
                    f"(external_ref {claimed.entry.external_ref})" + (f": {reason}" if reason
                                                                      else ""))
        status, result, retryable = Status.FAILED, b"", True
    try:
        done = yield from _complete_durably(policy, call, claimed, status, result, recorded,
                                            retryable)
    except AlreadyResolved as e:
        if resolution is not None and interrupted is None:
            # Settled by someone else first (a reconciler that took the entry once the lease
            # had ended after all): what they found is the answer.
            now = yield from _lookup_key(policy, call, claimed.key)
            if now is not None:
                return _settled_elsewhere(call, now, error)
        error.add_note(f"the ledger did not record this outcome: {e!r}")
        return CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=None,
                           error=interrupted or error, acted=True)
    except BaseException as e:  # the action's own exception goes on; this one is a note on it
        error.add_note(f"the ledger did not record this outcome: {e!r}")
        if not isinstance(e, Exception):
            interrupted = interrupted or e
        return CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=None,
                           error=interrupted or error, acted=True)
    entry = done.entry
    _attach(error, entry)
    if question is not None and interrupted is None:
        log_settlement(entry, said(answer), "run_once")
    if interrupted is None and resolution is not None and entry.status == Status.SUCCEEDED:
        return CallOutcome(Kind.CONFIRMED, value=call.codec.decode(resolution.result),
                           entry=entry, acted=True)
    if interrupted is None and resolution is not None and entry.status == Status.FAILED:
        return _not_found(entry, error)
    return CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=entry, error=interrupted or error,
                       acted=True)


def may_still_land(error: BaseException) -> bool:
    """Whether the action that raised `error` may still be running or its effect still landing:
    it outlived ``action_timeout`` (:class:`ActionTimeout`), its framework's timeout stopped it
    (:class:`ActionStopped`), or it was cancelled. A read that finds nothing then is no proof
    that nothing happened."""
    return any(isinstance(e, (ActionTimeout, ActionStopped, asyncio.CancelledError,
                              futures.CancelledError)) for e in causes(error))


def _not_found(entry: Entry, error: BaseException) -> CallOutcome[Any]:
    """An unknown outcome the paired read found did not happen: the intent may be tried again."""
    nothing = NotExecuted(entry.error)
    nothing.__cause__ = error
    nothing.entry = entry
    return CallOutcome(Kind.NOT_FOUND, note=NOT_PERFORMED_NOTE, entry=entry, error=nothing,
                       acted=True)


def _settled_elsewhere(call: Call, now: Entry, error: BaseException) -> CallOutcome[Any]:
    """The outcome of this call's attempt as someone else settled it first."""
    unknown = CallOutcome(Kind.UNKNOWN, note=UNKNOWN_NOTE, entry=now, error=error, acted=True)
    if now.status == Status.SUCCEEDED:
        try:
            value = call.codec.decode(now.result)
        except Exception:
            return unknown
        return CallOutcome(Kind.CONFIRMED, value=value, entry=now, acted=True)
    if now.status == Status.FAILED and now.retryable:
        return _not_found(now, error)
    if now.status == Status.FAILED:  # a person settled it as failed for good
        permanent = PermanentFailure(now.error or "settled as failed for good")
        permanent.__cause__ = error
        permanent.entry = now
        return CallOutcome(Kind.FAILED, note=now.error, entry=now, error=permanent, acted=True)
    return unknown


def _lookup_key(policy: Policy, call: Call, key: str) -> Steps[Entry | None]:
    try:
        return (yield from lookup(policy, wire.lookup_request(key, None, None, None,
                                                              call.canonicalization),
                                  call.timeout))
    except LedgerError:
        return None


def _record(policy: Policy, call: Call, claimed: ClaimResult, status: Status, text: str,
            retryable: bool, exc: BaseException) -> Steps[tuple[Entry | None,
                                                                BaseException | None]]:
    """Completes the attempt as failed; (the entry, or None when the ledger could not record it
    and the entry reads UNKNOWN when its lease ends; what interrupted the recording, if it was
    a cancellation)."""
    try:
        done = yield from _complete_durably(policy, call, claimed, status, b"", text, retryable)
    except BaseException as e:  # the action's own exception goes on; this one is a note on it
        exc.add_note(f"the ledger did not record this outcome: {e!r}")
        return None, None if isinstance(e, Exception) else e
    return done.entry, None


def _complete_durably(policy: Policy, call: Call, claimed: ClaimResult, status: Status,
                      result: bytes, error: str, retryable: bool) -> Steps[Completion]:
    """Completes the claimed attempt, sending the same Complete again (it is idempotent) after
    UNAVAILABLE or DEADLINE_EXCEEDED within the retry budget, and at least the lease."""
    budget = max(policy.retry_budget, granted_lease(claimed) or 0.0)
    return (yield from complete(policy, claimed.key, claimed.claim_token, status, result,
                                error[:MAX_ERROR_CHARS], retryable, call.timeout, budget=budget,
                                also=(DeadlineExceeded,)))


def complete_late(policy: Policy, call: Call, claimed: ClaimResult,
                  acted: Acted) -> Steps[None]:
    """Records what an action abandoned at its ``action_timeout`` did after all, with the same
    claim token (so only if nobody resolved the entry since). An exception that does not say it
    certainly did not act leaves the entry UNKNOWN."""
    try:
        if acted.error is not None:
            status, text, retryable, _ = classify(acted.error, call.not_executed)
            if status == Status.UNKNOWN:
                return
            yield from complete(policy, claimed.key, claimed.claim_token, status, b"", text,
                                retryable, call.timeout, budget=0.0)
        else:
            yield from complete(policy, claimed.key, claimed.claim_token, Status.SUCCEEDED,
                                call.codec.encode(acted.value), "", False, call.timeout,
                                budget=0.0)
    except Exception as e:  # a reconciler settles it; nobody waits for this
        log.info("the late outcome of %s was not recorded: %s", claimed.key, e)


def release(policy: Policy, claimed: ClaimResult) -> Steps[None]:
    """Gives back a claim the caller was cancelled before it could act on."""
    budget = max(policy.retry_budget, granted_lease(claimed) or 0.0)
    yield from complete(policy, claimed.key, claimed.claim_token, Status.FAILED, b"",
                        "CancelledError: cancelled while claiming, before acting", True, None,
                        budget=budget, also=(DeadlineExceeded,))


# --- settling an unknown outcome with the tool's confirm --------------------------------------


def settler(policy: Policy, call: Call) -> str:
    """Who a call settles as (``resolved_by``): the call's principal, else the client's, else
    ``confirm@host:pid`` (an empty principal counts as none)."""
    return call.principal or policy.settler


def pause_since_unknown(entry: Entry, delay: float) -> float:
    """What is left of ``confirm_delay`` since the entry became unknown (its Complete, or the
    end of its lease), so that a repeat arriving at once gives the outside world the same time
    to show the effect as the call that met the unknown outcome."""
    since = entry.finished_at or entry.lease_expires_at
    if since is None or delay <= 0:
        return 0.0
    left = min(delay, (since - datetime.now(UTC)).total_seconds() + delay)
    return max(left, 0.0)


def settle(policy: Policy, call: Call, entry: Entry, *, pause: float) -> Steps[Entry | None]:
    """Settles the UNKNOWN `entry` a repeat met with ``call.confirm``; returns the entry as it
    then stands (None if the ledger could not be asked). One settlement wins across callers and
    servers: the entry is taken with ``Reconcile(keys=[key])``, which hands it out only if it is
    unresolved, past the server's reconcile grace, and no other reconciler holds it; when it is
    not handed out, someone else holds or settled it (or the grace is not over), and this waits
    (up to the call's `wait`) for what they find. The finding is fenced by the attempt and hold
    token handed out: one the ledger did not apply is logged (:func:`log_unapplied`) and the
    entry as it stands now is the answer."""
    assert call.confirm is not None
    if pause > 0:
        yield Sleep(pause)
    key = entry.key
    who = settler(policy, call)
    try:
        taken = yield from reconcile(
            policy, wire.reconcile_request(None, "", 1, (), False, (key,), who),
            call.timeout, budget=policy.retry_budget)
    except LedgerError as e:
        log.warning("could not take %s (%s) to settle it: %s", key, call.tool, e)
        return None
    mine = next((e for e in taken.pending if e.key == key), None)
    if mine is None:  # held by someone else, or still inside the server's reconcile grace
        return (yield from _settled_elsewhere_by(policy, call, key))
    question = UnknownAttempt(key=key, external_ref=mine.external_ref,
                              arguments=json.loads(arguments_json(call.arguments)),
                              number=mine.attempt, tool=mine.tool, run_id=mine.run_id, entry=mine)
    answer = yield from ask(call.confirm, question)
    resolution = resolution_of(answer, question, call.codec, mine)
    if resolution is None:
        log_settlement(mine, "cannot_tell", "a repeat")
        return mine
    try:
        done = yield from reconcile(
            policy, wire.reconcile_request(None, "", 0, (resolution,), True, (), who),
            call.timeout, budget=policy.retry_budget)
    except LedgerError as e:
        log.warning("could not settle %s (%s): %s", key, call.tool, e)
        return None
    result = next((r for r in done.results if r.key == key), None)
    if result is None or result.entry is None:  # gone (expired) meanwhile
        return None
    if result.applied:
        log_settlement(result.entry, said(answer), "a repeat")
        return result.entry
    # Fenced out: the attempt moved on, someone else holds the entry now, or its claimant's
    # late Complete resolved it. Not ours: what stands now is the answer (or what the other
    # holder finds).
    log_unapplied(result, mine, said(answer), "a repeat")
    if result.entry.status == Status.UNKNOWN:
        return (yield from _settled_elsewhere_by(policy, call, key))
    return result.entry


def _settled_elsewhere_by(policy: Policy, call: Call, key: str) -> Steps[Entry | None]:
    """Waits (up to the call's wait) for someone else's settlement of `key`; logs it."""
    now = yield from _await_settlement(policy, call, key)
    if now is not None and now.status != Status.UNKNOWN:
        log_settlement(now, "elsewhere", "a repeat")
    return now


def _await_settlement(policy: Policy, call: Call, key: str) -> Steps[Entry | None]:
    """Looks the entry up until it is no longer UNKNOWN, or the call's wait is over."""
    limit = wire.seconds(call.wait) or 0.0
    started = time.monotonic()
    pause, longest = _SETTLING_POLL
    while True:
        entry = yield from _lookup_key(policy, call, key)
        if entry is None:
            return None
        left = limit - (time.monotonic() - started)
        if entry.status != Status.UNKNOWN or left <= 0:
            return entry
        yield Sleep(min(pause, left))
        pause = min(pause * 2, longest)


def ask(confirm: Callable[[UnknownAttempt], Any], question: UnknownAttempt) -> Steps[Any]:
    """Asks `confirm`; an exception it raises is "cannot tell" (logged)."""
    try:
        return (yield Ask(confirm, question))
    except Exception as e:
        log.warning("confirm of %s raised for %s (%s): %r; read as cannot tell", question.tool,
                    question.key, question.external_ref, e)
        return Confirmation(Answer.CANNOT_TELL, reason=f"confirm raised {e!r}")


def resolution_of(answer: Any, question: UnknownAttempt, codec: Codec,
                  pending: Entry) -> Resolution | None:
    """The resolution a confirm's answer makes about `pending` (the entry as it was handed out,
    whose attempt and hold token fence it; None: cannot tell, the entry stays UNKNOWN)."""
    if not isinstance(answer, Confirmation):
        log.error("confirm of %s returned %r: it must return found(result), not_found() or "
                  "cannot_tell() (idempotency_ledger); read as cannot tell", question.tool,
                  answer)
        return None
    if answer.answer == Answer.FOUND:
        try:
            payload = codec.encode(answer.result)
        except Exception as e:
            log.error("confirm of %s found %s but its result cannot be encoded (%s); read as "
                      "cannot tell", question.tool, question.key, error_text(e))
            return None
        return Resolution.found(pending, payload)
    if answer.answer == Answer.NOT_FOUND:
        # The TypeScript client's words, and the read's own reason after them.
        reason = (f"the tool's paired read found no effect with reference "
                  f"{question.external_ref}" + (f": {answer.reason}" if answer.reason else ""))
        return Resolution.not_found(pending, reason[:MAX_ERROR_CHARS], retryable=True)
    return None


# --- how an action's failure is recorded ------------------------------------------------------


def arity_error(action: Callable[..., Any]) -> TypeError | None:
    """A TypeError when `action` cannot be called with one attempt (it certainly did not act)."""
    try:
        signature = inspect.signature(action)
    except (TypeError, ValueError):
        return None  # a callable without a signature (a builtin): let the call decide
    try:
        signature.bind(None)
    except TypeError as e:
        return TypeError(f"run_once calls action(attempt) with one argument, but {action!r} "
                         f"cannot take it: {e}")
    return None


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]


def causes(error: BaseException) -> list[BaseException]:
    """`error` and what it was raised from (``raise ... from``), as a framework wraps it."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and not any(current is seen for seen in chain):
        chain.append(current)
        current = current.__cause__
    return chain


def _action_failure(error: BaseException) -> _ActionFailure | None:
    return next((e for e in causes(error) if isinstance(e, _ActionFailure)), None)


def classify(error: BaseException, not_executed: Iterable[type[BaseException]] = (),
             ) -> tuple[Status, str, bool, BaseException]:
    """How an action's exception is recorded: (status, error text, retryable, the exception to
    raise). UNKNOWN unless the exception (or what it was raised from) is a ``NotExecuted`` or
    of a `not_executed` class (FAILED, retryable), or a ``PermanentFailure`` (FAILED)."""
    if isinstance(error, BeforeActing):
        return Status.FAILED, error_text(error.error), True, error.error
    chain = causes(error)
    failure = _action_failure(error)
    declared = tuple(not_executed)
    if isinstance(failure, NotExecuted):
        return Status.FAILED, error_text(failure), True, error
    if declared and any(isinstance(e, declared) for e in chain):
        return Status.FAILED, error_text(error), True, error
    if isinstance(failure, PermanentFailure):
        return Status.FAILED, error_text(failure), False, error
    return Status.UNKNOWN, error_text(error), False, error


def granted_lease(claimed: ClaimResult) -> float | None:
    """The lease the server granted the claim, in seconds (the claim's own, or the server's
    default), which renewals ask for again."""
    entry = claimed.entry
    if entry.lease_expires_at is None or entry.started_at is None:
        return None
    lease = (entry.lease_expires_at - entry.started_at).total_seconds()
    return lease if lease > 0 else None
