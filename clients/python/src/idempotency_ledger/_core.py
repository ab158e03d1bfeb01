"""The sans-I/O core both clients drive: the steps, the calls sent again, and the settling of
an unknown outcome with a tool's ``confirm`` (what run_once decides with them is ``_run_once``).

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

import json
import logging
import os
import random
import re
import socket
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from . import _wire as wire
from ._confirm import log_settlement, log_unapplied, said
from ._failures import MAX_ERROR_CHARS, error_text
from .codec import Codec
from .errors import (
    LedgerError,
    Unavailable,
)
from .keys import arguments_json
from .model import (
    Answer,
    Attempt,
    Canonicalization,
    ClaimResult,
    Completion,
    Confirmation,
    Entry,
    Reconciliation,
    Resolution,
    Status,
    UnknownAttempt,
)

T = TypeVar("T")
log = logging.getLogger("idempotency_ledger")

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
    return wire.completion(r, result)


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


def lookup_key(policy: Policy, call: Call, key: str) -> Steps[Entry | None]:
    """The entry of `key` as it stands, or None when the ledger cannot say."""
    try:
        return (yield from lookup(policy, wire.lookup_request(key, None, None, None,
                                                              call.canonicalization),
                                  call.timeout))
    except LedgerError:
        return None


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
        entry = yield from lookup_key(policy, call, key)
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


def granted_lease(claimed: ClaimResult) -> float | None:
    """The lease the server granted the claim, in seconds (the claim's own, or the server's
    default), which renewals ask for again."""
    entry = claimed.entry
    if entry.lease_expires_at is None or entry.started_at is None:
        return None
    lease = (entry.lease_expires_at - entry.started_at).total_seconds()
    return lease if lease > 0 else None
