"""What run_once decides, written once for both clients (sans I/O): claim (waiting for an
attempt in flight), act if the claim is won, record what happened as the action's exception
says (``_failures``), settle an unknown outcome with the tool's ``confirm`` under the call's own
claim, and answer a claim that was not won. Generators of the steps of ``_core``, which the
clients' drivers run (``_blocking``, ``_aio``)."""

from __future__ import annotations

import json
import logging
from typing import Any, TypeVar

from . import _wire as wire
from ._confirm import log_settlement, said
from ._core import (
    NOT_PERFORMED_NOTE,
    Act,
    Acted,
    Call,
    Policy,
    ReleaseLate,
    Sleep,
    Steps,
    StopRenewing,
    ask,
    claim,
    complete,
    granted_lease,
    lookup_key,
    pause_since_unknown,
    resolution_of,
    settle,
)
from ._failures import (
    MAX_ERROR_CHARS,
    _action_failure,
    arity_error,
    classify,
    error_text,
    may_still_land,
)
from .codec import Codec
from .errors import (
    UNKNOWN_NOTE,
    ActionTimeout,
    AlreadyResolved,
    AwaitingApprovalError,
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
)
from .keys import arguments_json
from .model import (
    Attempt,
    CallOutcome,
    ClaimResult,
    Completion,
    Confirmation,
    Entry,
    Kind,
    Outcome,
    Resolution,
    Result,
    Status,
    UnknownAttempt,
)

T = TypeVar("T")
log = logging.getLogger("idempotency_ledger")


def attempt(policy: Policy, call: Call) -> Steps[CallOutcome[Any]]:
    """Claims, acts if the claim is won, records what happened, settles an unknown outcome with
    the tool's ``confirm``; returns what became of the call, never raising for an outcome (a
    call the ledger refuses, or that cannot reach it, raises its :class:`LedgerError`)."""
    request = wire.claim_request(
        call.run_id, call.tool, call.arguments, key=call.key,
        canonicalization=call.canonicalization, lease=call.lease, retention=call.retention,
        wait=call.wait, principal=policy.principal if call.principal is None else call.principal,
        require_approval=call.require_approval, wait_for_attempt_only=True)
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
    """One Claim, with the call's `wait` for an attempt in flight only (``WAIT_FOR_ATTEMPT``,
    set by :func:`attempt`): a duplicate of an attempt in flight waits for its result, while a
    call awaiting a person's decision is answered at once, since the decision may take days."""
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


def run_once(policy: Policy, call: Call) -> Steps[Result[Any]]:
    """:func:`attempt`, then :func:`result_of`: run_once's answer, or the outcome's exception."""
    return result_of((yield from attempt(policy, call)))


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
            now = yield from lookup_key(policy, call, claimed.key)
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
