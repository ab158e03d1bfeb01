"""The ledger's values as plain Python: enums mirroring the proto's, and frozen dataclasses for
entries and answers (datetimes in UTC, durations in seconds)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

__all__ = [
    "Attempt",
    "Canonicalization",
    "ClaimResult",
    "Completion",
    "Entry",
    "Outcome",
    "Reconciliation",
    "Resolution",
    "Result",
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

    @classmethod
    def _missing_(cls, value: object) -> Status:
        return cls.UNSPECIFIED


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


@dataclass(frozen=True)
class Completion:
    """What a Complete answered."""

    entry: Entry
    #: True when this exact outcome had already been recorded (a retried Complete).
    already_completed: bool


@dataclass(frozen=True)
class Resolution:
    """What a tool's own read found for an unresolved entry, sent with Reconcile."""

    key: str
    status: Status
    result: bytes = b""
    error: str = ""
    retryable: bool = False

    @classmethod
    def found(cls, key: str, result: bytes) -> Resolution:
        """The effect exists: the entry becomes ``SUCCEEDED`` with `result`."""
        return cls(key, Status.SUCCEEDED, result=result)

    @classmethod
    def not_found(cls, key: str, error: str, *, retryable: bool = True) -> Resolution:
        """The effect does not exist: the entry becomes ``FAILED``; `retryable` (the usual case)
        lets the next claim of the intent run it again."""
        return cls(key, Status.FAILED, error=error, retryable=retryable)


@dataclass(frozen=True)
class Reconciliation:
    """What a Reconcile answered."""

    #: Unresolved entries, oldest first, held for this caller for the server's reconcile lease.
    pending: list[Entry] = field(default_factory=list)
    #: The entries the request's resolutions named, as they stand afterwards.
    resolved: list[Entry] = field(default_factory=list)


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

    def for_model(self) -> T | dict[str, Any]:
        """What the model should read: the value itself on a first run; on a repeat, the stored
        value with the ledger's note, so the model knows that nothing new was done::

            {"status": "already_done", "note": "This action was already performed ...",
             "result": <the stored value>}
        """
        if not self.replayed:
            return self.value
        return {"status": "already_done", "note": self.note, "result": self.value}
