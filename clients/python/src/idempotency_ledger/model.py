"""The ledger's values as plain Python: enums mirroring the proto's, and frozen dataclasses for
entries and answers (datetimes in UTC, durations in seconds)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

__all__ = [
    "Approval",
    "ApprovalEvent",
    "ApprovalState",
    "Attempt",
    "Canonicalization",
    "ClaimResult",
    "Completion",
    "Decision",
    "Entry",
    "Outcome",
    "Reconciliation",
    "Resolution",
    "ResolutionOutcome",
    "ResolutionResult",
    "Result",
    "RunExtension",
    "Status",
]


class Outcome(enum.IntEnum):
    """What a Claim found (``idempotency.v1.Outcome``, same numbers)."""

    UNSPECIFIED = 0
    #: The caller holds the claim: act now, then Complete with the claim token.
    CLAIMED = 1
    #: The action already succeeded in this intent: the entry holds the stored result.
    REPLAYED = 2
    #: Another attempt holds the key (ATTEMPTING), or its outcome is unknown (UNKNOWN).
    IN_PROGRESS = 3
    #: The action failed permanently in this intent: the entry holds the stored error.
    PREVIOUSLY_FAILED = 4
    #: The tool is gated: a person has been asked to decide and nothing was done.
    AWAITING_APPROVAL = 5
    #: A person declined this call: it was not done; do not retry it unchanged.
    DENIED = 6

    @classmethod
    def _missing_(cls, value: object) -> Outcome:
        return cls.UNSPECIFIED  # a value a newer server added


class Status(enum.IntEnum):
    """The state of an entry (``idempotency.v1.Status``, same numbers)."""

    UNSPECIFIED = 0
    ATTEMPTING = 1
    SUCCEEDED = 2
    FAILED = 3
    UNKNOWN = 4
    #: A gated call waits for a person's decision.
    AWAITING_APPROVAL = 5
    #: A person declined the call: terminal, replayed to every repeat as ``Outcome.DENIED``.
    DENIED = 6

    @classmethod
    def _missing_(cls, value: object) -> Status:
        return cls.UNSPECIFIED


class ApprovalState(enum.IntEnum):
    """Where an entry's approval stands (``idempotency.v1.ApprovalState``, same numbers)."""

    #: No approval is involved.
    UNSPECIFIED = 0
    #: A person has been asked; undecided until ``decide_by``.
    REQUESTED = 1
    #: Approved: the next claim (before ``execute_by``) acts, once.
    APPROVED = 2
    #: Declined.
    DENIED = 3
    #: Not decided by ``decide_by``, or not used by ``execute_by``: the next claim asks again.
    EXPIRED = 4
    #: Approved and used by a claim that acted.
    USED = 5

    @classmethod
    def _missing_(cls, value: object) -> ApprovalState:
        return cls.UNSPECIFIED


class Decision(enum.StrEnum):
    """A person's decision (``idempotency.v1.Decision``): ``ledger.decide(..., "approve")``."""

    APPROVE = "APPROVE"
    DENY = "DENY"


def _when(pb: Any, name: str) -> datetime | None:
    if not pb.HasField(name):
        return None
    stamp: datetime = getattr(pb, name).ToDatetime(tzinfo=UTC)
    return stamp


@dataclass(frozen=True)
class Approval:
    """The approval of a call that needed a person's decision (``idempotency.v1.Approval``)."""

    state: ApprovalState
    requested_at: datetime | None = None
    #: Until when a person may decide; undecided after it, the request lapses.
    decide_by: datetime | None = None
    decided_at: datetime | None = None
    #: Who decided: the approver credential's principal, as the server recorded it.
    decided_by: str = ""
    #: Why, in the approver's words.
    reason: str = ""
    #: Until when an approval may be used; unused after it, it lapses.
    execute_by: datetime | None = None

    @classmethod
    def from_pb(cls, pb: Any) -> Approval:
        return cls(state=ApprovalState(pb.state), requested_at=_when(pb, "requested_at"),
                   decide_by=_when(pb, "decide_by"), decided_at=_when(pb, "decided_at"),
                   decided_by=pb.decided_by, reason=pb.reason,
                   execute_by=_when(pb, "execute_by"))


class Canonicalization(enum.StrEnum):
    """How arguments are canonicalized before hashing (``idempotency.v1.Canonicalization``)."""

    #: RFC 8785: member order, whitespace and number spelling do not change the key.
    JCS = "JCS"
    #: JCS after trimming White_Space around string values and dropping null members; its keys
    #: never collide with JCS's.
    JCS_LENIENT = "JCS_LENIENT"


@dataclass(frozen=True)
class Entry:
    """One ledger entry: one intent of one tool call (``idempotency.v1.Entry``)."""

    key: str
    run_id: str
    tool: str
    fingerprint: str
    status: Status
    attempt: int
    #: The stored result (``SUCCEEDED``), byte for byte.
    result: bytes
    error: str
    retryable: bool
    principal: str
    started_at: datetime | None
    finished_at: datetime | None
    lease_expires_at: datetime | None
    expires_at: datetime | None
    replay_count: int
    #: The deterministic reference to hand to external systems (a memo, an idempotency header).
    external_ref: str
    #: The tool's arguments in canonical form, as the server keeps them for audit (secrets
    #: redacted by its ``--store-arguments`` policy). Set by ``lookup`` and ``list_entries``
    #: only; empty in the answers of claim, complete and reconcile.
    arguments_json: str = ""
    #: Who settled an outcome nobody knew: the ``principal`` of the Reconcile that resolved the
    #: entry (a reconciler, a tool's ``confirm``, an operator). Empty when the claimant's own
    #: Complete resolved it, or while it is unresolved.
    resolved_by: str = ""
    #: Set on the entries Reconcile hands out (``pending``): this hand-out's token, to send
    #: back in the :class:`Resolution` (a later hand-out replaces it). Empty elsewhere.
    hold_token: str = ""
    #: A finding said an earlier attempt's effect exists while a later attempt was started (or
    #: after the attempt was recorded as not done): the intent may have acted twice. Set until
    #: a person acknowledges it.
    possible_double_effect: bool = False
    #: The person's decision this call needed (``None`` when it needed none).
    approval: Approval | None = None

    @classmethod
    def from_pb(cls, pb: Any) -> Entry:
        def when(name: str) -> datetime | None:
            if not pb.HasField(name):
                return None
            stamp: datetime = getattr(pb, name).ToDatetime(tzinfo=UTC)
            return stamp

        return cls(
            key=pb.key,
            run_id=pb.run_id,
            tool=pb.tool,
            fingerprint=pb.fingerprint,
            status=Status(pb.status),
            attempt=pb.attempt,
            result=bytes(pb.result),
            error=pb.error,
            retryable=pb.retryable,
            principal=pb.principal,
            started_at=when("started_at"),
            finished_at=when("finished_at"),
            lease_expires_at=when("lease_expires_at"),
            expires_at=when("expires_at"),
            replay_count=pb.replay_count,
            external_ref=pb.external_ref,
            arguments_json=pb.arguments_json,
            resolved_by=pb.resolved_by,
            hold_token=pb.hold_token,
            possible_double_effect=pb.possible_double_effect,
            approval=Approval.from_pb(pb.approval) if pb.HasField("approval") else None,
        )


@dataclass(frozen=True)
class ClaimResult:
    """What a Claim answered."""

    outcome: Outcome
    entry: Entry
    #: Set only with ``CLAIMED``: the fencing token to complete with.
    claim_token: str
    #: A sentence for the model (empty with ``CLAIMED``).
    note: str
    #: With ``IN_PROGRESS``: seconds after which a new claim is worth trying.
    retry_after: float | None

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def fingerprint(self) -> str:
        """The entry's fingerprint: what an approver echoes to ``decide`` (the arguments the
        person was shown)."""
        return self.entry.fingerprint

    @property
    def approval(self) -> Approval | None:
        """The entry's approval (``AWAITING_APPROVAL``: ``decide_by``; ``DENIED``: who declined
        and why), or ``None`` when the call needed no decision."""
        return self.entry.approval


@dataclass(frozen=True)
class ApprovalEvent:
    """One event of ``watch_approvals``: a request, decision, use or expiry of the caller's
    tenant. Pass ``cursor`` back to resume after it."""

    cursor: str
    #: ``"requested"``, ``"approved"``, ``"denied"``, ``"expired"`` or ``"used"``.
    kind: str
    at: datetime | None
    #: Who: the approver of a decision, the claimant of a request or a use.
    principal: str
    #: The entry as it stood just after (its tool, arguments as stored, run, approval).
    entry: Entry


@dataclass(frozen=True)
class RunExtension:
    """What ``extend_run`` did."""

    #: How many finished entries of the run now expire later than they did.
    extended: int
    #: The earliest a finished entry of the run may now expire (``None``: the run has none).
    kept_until: datetime | None


@dataclass(frozen=True)
class Completion:
    """What a Complete answered."""

    entry: Entry
    #: True when this exact outcome had already been recorded (a retried Complete).
    already_completed: bool


@dataclass(frozen=True)
class Resolution:
    """What a read found about one unresolved entry handed out by Reconcile, sent back with
    Reconcile. Fenced: it names the `attempt` it observed and the `hold_token` the entry was
    handed out with (both from the pending :class:`Entry`), and the server applies it only while
    the entry is still unresolved at that attempt under that hold; a resolution without them is
    refused (``InvalidArgument`` ``UNFENCED_RESOLUTION``)."""

    key: str
    status: Status
    result: bytes = b""
    error: str = ""
    retryable: bool = False
    #: The attempt the read was about: the pending entry's ``attempt``.
    attempt: int = 0
    #: The pending entry's ``hold_token``.
    hold_token: str = ""

    @classmethod
    def found(cls, pending: Entry, result: bytes) -> Resolution:
        """The effect of `pending` (an entry Reconcile handed out) exists: the entry becomes
        ``SUCCEEDED`` with `result`."""
        _check_pending(pending)
        return cls(pending.key, Status.SUCCEEDED, result=result, attempt=pending.attempt,
                   hold_token=pending.hold_token)

    @classmethod
    def not_found(cls, pending: Entry, error: str, *, retryable: bool = True) -> Resolution:
        """The effect of `pending` does not exist: the entry becomes ``FAILED``; `retryable`
        (the usual case) lets the next claim of the intent run it again."""
        _check_pending(pending)
        return cls(pending.key, Status.FAILED, error=error, retryable=retryable,
                   attempt=pending.attempt, hold_token=pending.hold_token)


def _check_pending(pending: object) -> None:
    if not isinstance(pending, Entry):
        raise TypeError(
            f"a Resolution is made from the pending Entry Reconcile handed out (it carries the "
            f"attempt and hold_token the ledger fences the finding with), not {pending!r}; with "
            "a key alone, give them yourself: Resolution(key, status, attempt=..., "
            "hold_token=...)")


class ResolutionOutcome(enum.IntEnum):
    """What became of one :class:`Resolution` (``idempotency.v1.ResolutionOutcome``, same
    numbers)."""

    UNSPECIFIED = 0
    #: The finding settled the entry.
    APPLIED = 1
    #: Nothing changed: a later attempt was started, or the entry was handed out again since
    #: (another hold), or it is not unknown. The server logged, counted and kept it.
    STALE = 2
    #: Nothing changed: the attempt was already resolved (its claimant's late Complete, another
    #: finding).
    ALREADY_RESOLVED = 3
    #: No such entry (it expired).
    NOT_FOUND = 4

    @classmethod
    def _missing_(cls, value: object) -> ResolutionOutcome:
        return cls.UNSPECIFIED


@dataclass(frozen=True)
class ResolutionResult:
    """What became of one resolution of a Reconcile (``idempotency.v1.ResolutionResult``)."""

    key: str
    #: Applied, stale, already resolved or not found.
    result: ResolutionOutcome
    #: The entry as it stands now: its current attempt and status (None with ``NOT_FOUND``).
    entry: Entry | None
    #: Why it was not applied, in words.
    note: str = ""

    @property
    def applied(self) -> bool:
        return self.result == ResolutionOutcome.APPLIED


@dataclass(frozen=True)
class Reconciliation:
    """What a Reconcile answered."""

    #: Unresolved entries, oldest first, held for this caller for the server's reconcile lease;
    #: each carries its ``attempt`` and ``hold_token``, for its :class:`Resolution`.
    pending: list[Entry] = field(default_factory=list)
    #: The entries the request's resolutions named, as they stand afterwards.
    resolved: list[Entry] = field(default_factory=list)
    #: What became of each resolution, in the request's order.
    results: list[ResolutionResult] = field(default_factory=list)


@dataclass(frozen=True)
class Attempt:
    """What ``run_once`` hands the action it runs: the claimed entry."""

    entry: Entry
    claim_token: str

    @property
    def key(self) -> str:
        return self.entry.key

    @property
    def external_ref(self) -> str:
        """Pass this to the external system as its idempotency key or memo, so that a reconciler
        can find the effect by it."""
        return self.entry.external_ref

    @property
    def number(self) -> int:
        """1 for the first attempt, one more after each retryable failure."""
        return self.entry.attempt


T = TypeVar("T")


@dataclass(frozen=True)
class Result(Generic[T]):
    """The value of a tool call made through ``run_once``.

    ``replayed`` is True when the action was not run because the same intent already succeeded:
    ``value`` is then the stored result and ``note`` the ledger's sentence for the model ("This
    action was already performed in this run; returning the earlier result. No new action was
    taken."). Tell the model both.
    """

    value: T
    replayed: bool
    note: str
    entry: Entry
    #: True when this call's action left its outcome unknown and the tool's ``confirm`` found
    #: the effect: ``value`` is the result it found.
    confirmed: bool = False

    def for_model(self) -> T | dict[str, Any]:
        """What the model should read: the value itself on a first run; on a repeat, the stored
        value with the ledger's note, so the model knows that nothing new was done::

            {"status": "already_done", "note": "This action was already performed ...",
             "result": <the stored value>}
        """
        if not self.replayed:
            return self.value
        return {"status": "already_done", "note": self.note, "result": self.value}


# --- the paired read: did an attempt whose outcome nobody knows take effect? ------------------


@dataclass(frozen=True)
class UnknownAttempt:
    """What a tool's ``confirm`` is asked about: an attempt whose outcome nobody knows (it timed
    out, crashed, outlived ``action_timeout``, or its lease ended without a Complete). Look the
    effect up in the outside world by ``external_ref`` (what the action passed downstream) or
    by the arguments."""

    #: The entry's key.
    key: str
    #: The reference the action passed to the external system (``Attempt.external_ref``).
    external_ref: str
    #: The call's arguments in their JSON form (a dict). The reconciler reads them from the
    #: ledger, which keeps them as its ``--store-arguments`` policy says (secrets redacted).
    arguments: dict[str, Any]
    #: The attempt number (1 for the first attempt).
    number: int
    #: The tool's name.
    tool: str
    #: The run the call belongs to (empty for an explicit key).
    run_id: str
    #: The entry as the ledger holds it.
    entry: Entry


class Answer(enum.StrEnum):
    """What a ``confirm`` can answer (:class:`Confirmation` ``.answer``)."""

    #: The effect exists: the entry becomes ``SUCCEEDED`` with the result given.
    FOUND = "found"
    #: The effect certainly does not exist: the entry becomes ``FAILED``, retryable.
    NOT_FOUND = "not_found"
    #: The read cannot say (the external system is down too): the entry stays ``UNKNOWN``.
    CANNOT_TELL = "cannot_tell"


@dataclass(frozen=True)
class Confirmation:
    """A ``confirm``'s answer; make it with :func:`found`, :func:`not_found` or
    :func:`cannot_tell`."""

    answer: Answer
    #: With ``FOUND``: the result the tool would have returned (encoded by the tool's codec).
    result: Any = None
    #: Why: stored as the entry's error with ``NOT_FOUND``, logged with ``CANNOT_TELL``.
    reason: str = ""


def found(result: Any) -> Confirmation:
    """The effect happened; `result` is what the tool would have returned for it (the model reads
    it as the call's result, and repeats replay it)."""
    return Confirmation(Answer.FOUND, result=result)


def not_found(reason: str = "") -> Confirmation:
    """The effect certainly did not happen: the entry becomes ``FAILED`` and retryable, so the
    next call of the intent acts (once)."""
    return Confirmation(Answer.NOT_FOUND, reason=reason)


def cannot_tell(reason: str = "") -> Confirmation:
    """The read cannot say: the entry stays ``UNKNOWN`` for the reconciler or a person."""
    return Confirmation(Answer.CANNOT_TELL, reason=reason)


# --- what a call through the ledger came to ---------------------------------------------------


class Kind(enum.StrEnum):
    """What became of one call of ``attempt`` (and so of ``run_once`` and the tool wrappers)."""

    #: The action ran and succeeded now.
    PERFORMED = "performed"
    #: The action's outcome was unknown, and its ``confirm`` found the effect: its result.
    CONFIRMED = "confirmed"
    #: The intent had succeeded before: the stored result.
    REPLAYED = "replayed"
    #: Another attempt holds the key (``ATTEMPTING``).
    IN_PROGRESS = "in_progress"
    #: Nobody knows whether the effect happened (this call's action, or an earlier attempt's).
    UNKNOWN = "unknown"
    #: The action failed for good before (``PREVIOUSLY_FAILED``).
    PREVIOUSLY_FAILED = "previously_failed"
    #: The action said it did not act (``NotExecuted``, a ``not_executed`` type): retryable.
    NOT_EXECUTED = "not_executed"
    #: The action's outcome was unknown, and its ``confirm`` found no effect: retryable.
    NOT_FOUND = "not_found"
    #: The action failed for good now (``PermanentFailure``).
    FAILED = "failed"
    #: The call waits for a person's decision: nothing was done (``AWAITING_APPROVAL``).
    AWAITING_APPROVAL = "awaiting_approval"
    #: A person declined the call: it was not done (``DENIED``).
    DENIED = "denied"


@dataclass(frozen=True)
class CallOutcome(Generic[T]):
    """What became of one call through the ledger, without raising: ``Ledger.attempt`` returns
    it, ``run_once`` turns it into a :class:`Result` or an exception, the tool wrappers into
    what the model reads."""

    kind: Kind
    #: The result (``PERFORMED``, ``CONFIRMED``, ``REPLAYED``).
    value: T | None = None
    #: The ledger's sentence for the model, where there is one.
    note: str = ""
    #: The entry as last seen (``None`` when the ledger could not be asked).
    entry: Entry | None = None
    #: The exception ``run_once`` raises for this outcome (the action's own, re-raised).
    error: BaseException | None = None
    #: With ``IN_PROGRESS`` / ``UNKNOWN`` from a claim: seconds before a new claim is worth it.
    retry_after: float | None = None
    #: True when this very call's action ran (its outcome is this call's, not an earlier one's).
    acted: bool = False
