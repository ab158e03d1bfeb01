"""Typed errors: the ledger's gRPC errors with their ``google.rpc.ErrorInfo`` reasons decoded, the
outcomes of :meth:`~idempotency_ledger.Ledger.run_once` that are not a result, and the exceptions
an action raises to say how it failed.

Every error the ledger sends carries a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer: an ``ErrorInfo`` (domain ``idempotency.v1``, the reason), for a bad field a ``BadRequest``
naming it, and with ``UNAVAILABLE`` a ``RetryInfo``. :func:`error_from_rpc` turns them into the
classes below; an error without details (a deadline the client enforced, a server that cannot be
reached) keeps its gRPC code and has ``reason`` ``None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from google.rpc import error_details_pb2, status_pb2

if TYPE_CHECKING:
    from .model import Entry

#: The ``ErrorInfo.domain`` of the ledger's errors.
ERROR_DOMAIN = "idempotency.v1"
_DETAILS_TRAILER = "grpc-status-details-bin"

__all__ = [
    "ActionStopped",
    "ActionTimeout",
    "AlreadyDecided",
    "AlreadyResolved",
    "ApprovalMismatch",
    "ApproverRoleRequired",
    "AwaitingApprovalError",
    "BeforeActing",
    "DataLoss",
    "DeadlineExceeded",
    "DeniedError",
    "FailedPrecondition",
    "InProgressError",
    "InternalError",
    "InvalidArgument",
    "KeyReused",
    "LeaseEnded",
    "LedgerError",
    "NotAwaitingApproval",
    "NotExecuted",
    "NotFound",
    "OutcomeUnknownError",
    "PermanentFailure",
    "PermissionDenied",
    "PreviouslyFailedError",
    "ResourceExhausted",
    "ResultNotEncodable",
    "StaleClaimToken",
    "StoreFull",
    "Unauthenticated",
    "Unavailable",
    "error_from_rpc",
]


class LedgerError(Exception):
    """Anything the ledger answered that is not a result.

    Attributes:
        code: the ``grpc.StatusCode`` (``None`` for the outcomes of ``run_once``).
        reason: the ``ErrorInfo`` reason, such as ``"DUPLICATE_MEMBER"``; ``None`` when the
            error carried no details (the client's own deadline, an unreachable server).
        field: the request field at fault (``BadRequest``), such as ``"arguments_json"``.
        retry_after: seconds to wait before trying again (``RetryInfo``, or the claim's
            ``retry_after``), or ``None``.
        message: the server's message.
    """

    #: The gRPC code of this class; subclasses fix it.
    default_code: grpc.StatusCode | None = None

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
        details: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.reason = reason
        self.field = field
        self.retry_after = retry_after
        #: The decoded ``google.rpc`` detail messages, as sent.
        self.details = details

    def __str__(self) -> str:
        parts = [self.code.name] if self.code else []
        # UNAUTHENTICATED and DEADLINE_EXCEEDED are both the code and the reason: say it once.
        if self.reason and self.reason not in parts:
            parts.append(self.reason)
        return f"[{' '.join(parts)}] {self.message}" if parts else self.message


class InvalidArgument(LedgerError):
    """Malformed input (``INVALID_ARGUMENT``); ``reason`` says what, ``field`` where. Nothing
    changed in the ledger."""

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class FailedPrecondition(LedgerError):
    """The request conflicts with the entry (``FAILED_PRECONDITION``)."""

    default_code = grpc.StatusCode.FAILED_PRECONDITION


class KeyReused(FailedPrecondition):
    """An explicit key came back with another tool or other arguments
    (``KEY_REUSED_WITH_DIFFERENT_REQUEST``): a caller bug, never a replay."""


class StaleClaimToken(FailedPrecondition):
    """A Complete with a token that is not the current claim's (``STALE_CLAIM_TOKEN``)."""


class AlreadyResolved(FailedPrecondition):
    """A Complete with another outcome for a resolved entry (``ALREADY_RESOLVED``); nothing
    changed."""


class LeaseEnded(FailedPrecondition):
    """A RenewLease for an attempt whose lease already ended, or an entry already resolved
    (``LEASE_ENDED``): the entry reads ``UNKNOWN`` (a reconciler may be asking the world about
    it) or has its outcome, and nothing changed. Stop renewing; complete with what happened."""


class ApprovalMismatch(FailedPrecondition):
    """A Decide whose fingerprint is not the entry's (``APPROVAL_MISMATCH``): the person was shown
    other arguments than the entry holds. Nothing changed."""


class AlreadyDecided(FailedPrecondition):
    """A Decide opposite to the decision already taken (``ALREADY_DECIDED``). Nothing changed."""


class NotAwaitingApproval(FailedPrecondition):
    """A Decide about an entry that awaits no decision: never gated, lapsed, or already used
    (``NOT_AWAITING_APPROVAL``). Nothing changed."""


class NotFound(LedgerError):
    """No such entry for this tenant (``ENTRY_NOT_FOUND``): absent, expired or another
    tenant's, indistinguishably."""

    default_code = grpc.StatusCode.NOT_FOUND


class Unauthenticated(LedgerError):
    """A missing, malformed or unknown bearer token (``UNAUTHENTICATED``)."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(LedgerError):
    """The credential may not make this call (``PERMISSION_DENIED``)."""

    default_code = grpc.StatusCode.PERMISSION_DENIED


class ApproverRoleRequired(PermissionDenied):
    """A Decide with a credential that has no approver role (``APPROVER_ROLE_REQUIRED``): only a
    person's token decides, never the agent's. Nothing changed."""


class ResourceExhausted(LedgerError):
    """A limit or load shedding (``RESOURCE_EXHAUSTED``: ``OVERLOADED``, ``RATE_LIMITED``,
    ``MESSAGE_TOO_LARGE``); nothing was done for the call."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class StoreFull(ResourceExhausted):
    """The server's store has no space left (``STORE_FULL``): nothing was written; worth
    trying again later, once an operator made room."""


class Unavailable(LedgerError):
    """The ledger or its store cannot serve the call now (``UNAVAILABLE``: ``STORE_UNAVAILABLE``,
    ``STORE_IO_ERROR``, ``STORE_CONTENTION``, ``STORE_READ_ONLY``, or no server at the address);
    ``retry_after`` says when to try again when the server sent it."""

    default_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(LedgerError):
    """The call's deadline passed (``DEADLINE_EXCEEDED``). A write the server had started still
    finishes: look the entry up to learn the truth."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class DataLoss(LedgerError):
    """The server found its store damaged (``DATA_LOSS``, ``STORE_CORRUPT``): an operator's
    matter; retrying does not help."""

    default_code = grpc.StatusCode.DATA_LOSS


class InternalError(LedgerError):
    """A bug or an unexpected answer (``INTERNAL`` and every other code)."""

    default_code = grpc.StatusCode.INTERNAL


# --- outcomes of run_once that are not a result -----------------------------------------------


class InProgressError(LedgerError):
    """``OUTCOME_IN_PROGRESS``: another attempt holds the key. Do not act; try again after
    ``retry_after`` seconds. ``entry`` is the entry as the claim found it; ``note`` is the
    server's sentence for the model."""

    def __init__(self, note: str, entry: Entry, retry_after: float | None) -> None:
        super().__init__(note or "another attempt of this call is in progress",
                         reason="IN_PROGRESS", retry_after=retry_after)
        self.note = note
        self.entry = entry

    def for_model(self) -> dict[str, Any]:
        """What to hand the model instead of a result: the note, and when to look again. Not an
        exception, so that a framework does not tell the model "tool failed, retry"."""
        return {"status": "in_progress", "note": self.note, "retry_after_seconds": self.retry_after}


class OutcomeUnknownError(InProgressError):
    """``OUTCOME_IN_PROGRESS`` with the entry ``STATUS_UNKNOWN``: an earlier attempt timed out
    or its lease ended without a Complete. It is never re-executed silently: a reconciler asks
    the outside world: the tool's ``confirm``, or the :class:`~idempotency_ledger.Reconciler`."""

    def __init__(self, note: str, entry: Entry, retry_after: float | None) -> None:
        super().__init__(note, entry, retry_after)
        self.reason = "OUTCOME_UNKNOWN"

    def for_model(self) -> dict[str, Any]:
        """The note for the model: the outcome is unknown, do not repeat the call."""
        return {"status": "outcome_unknown", "note": self.note}


#: What the model reads when this very call's action outlived its timeout or its result could
#: not be stored: the server's wording for an unknown outcome, as a repeat would get it.
UNKNOWN_NOTE = ("An earlier attempt of this action may or may not have taken effect: its outcome "
                "is unknown and is being reconciled. Do not repeat it. No new action was taken.")


class ActionTimeout(OutcomeUnknownError):
    """``run_once``'s action outlived ``action_timeout``: the entry was completed ``UNKNOWN``
    (it may have acted) and waits for a reconciler or the action's own late Complete; it is never
    re-executed. ``entry`` is the entry as recorded (``None`` if the ledger could not record it);
    ``timeout`` is the limit in seconds."""

    def __init__(self, entry: Entry | None, timeout: float) -> None:
        LedgerError.__init__(
            self, f"the action did not finish within its action_timeout of {timeout:g} s; the "
            "entry is recorded UNKNOWN and will not be run again until it is reconciled",
            reason="ACTION_TIMEOUT")
        self.note = UNKNOWN_NOTE
        self.entry = entry  # type: ignore[assignment]
        self.timeout = timeout


class ActionStopped(TimeoutError):
    """What a tool's action raises when its framework's own timeout ran out while it acted (the
    OpenAI Agents SDK's ``function_tool(timeout=...)``): the adapter stopped it so that the ledger
    settles the outcome with the tool's ``confirm`` and the model reads the ledger's answer, not
    the framework's "timed out". Recorded as an outcome nobody knows, as an action that outlived
    its ``action_timeout``: the effect may still land."""

    def __init__(self, framework: str, timeout: float) -> None:
        super().__init__(f"{framework} stopped the tool: its own timeout of {timeout:g} s ran "
                         "out while the tool acted")
        self.framework = framework
        self.timeout = timeout


class ResultNotEncodable(OutcomeUnknownError):
    """The action ran but what it returned cannot be stored (the codec could not encode it, or
    the ledger refused it: ``RESULT_TOO_LARGE``): the entry is completed ``UNKNOWN`` (the action
    may have acted) and every repeat gets :class:`OutcomeUnknownError` until it is settled.
    ``entry`` as recorded, ``key`` its key; the codec's or the ledger's error is ``__cause__``."""

    def __init__(self, key: str, entry: Entry | None, cause: BaseException) -> None:
        LedgerError.__init__(
            self, f"the action ran but its result could not be stored ({type(cause).__name__}: "
            f"{cause}); entry {key} is recorded UNKNOWN. Fix the action or the codec, then settle "
            "the entry with what happened: take it with Reconcile(keys=[key]), then send "
            "Resolution.found(pending, result) or Resolution.not_found(pending, error) about the "
            "pending entry handed out, or use the CLI's `idempotency-ledger resolve` command",
            reason="RESULT_NOT_ENCODABLE")
        self.note = UNKNOWN_NOTE
        self.entry = entry  # type: ignore[assignment]
        self.key = key


class PreviouslyFailedError(LedgerError):
    """``OUTCOME_PREVIOUSLY_FAILED``: the action failed permanently in this intent. ``error`` is
    the stored error; ``entry`` and ``note`` as the claim returned them."""

    def __init__(self, note: str, entry: Entry) -> None:
        # The server's note already quotes the stored error.
        super().__init__(note or entry.error, reason="PREVIOUSLY_FAILED")
        self.note = note
        self.entry = entry
        self.error = entry.error

    def for_model(self) -> dict[str, Any]:
        """The note for the model: do not retry this intent. The server's note quotes the
        stored error, so the error is not added again (``error`` has it for code)."""
        return {"status": "previously_failed", "note": self.note or self.error}


class AwaitingApprovalError(LedgerError):
    """``OUTCOME_AWAITING_APPROVAL``: the call waits for a person's decision; nothing was done.
    ``entry.approval`` says until when (``decide_by``); ``note`` is the server's sentence for the
    model. Claim again after the decision: an approval lets the next claim act, once."""

    def __init__(self, note: str, entry: Entry) -> None:
        super().__init__(note or "this call waits for a person's approval; nothing was done",
                         reason="AWAITING_APPROVAL")
        self.note = note
        self.entry = entry
        self.approval = entry.approval

    def for_model(self) -> dict[str, Any]:
        """What the model reads: a person has been asked, nothing was done."""
        return {"status": "awaiting_approval", "note": self.note}


class DeniedError(LedgerError):
    """``OUTCOME_DENIED``: a person declined this call; it was not done and will not be.
    ``reason`` of ``entry.approval`` is the person's; ``note`` the server's sentence for the
    model."""

    def __init__(self, note: str, entry: Entry) -> None:
        super().__init__(note or "a person declined this call; it was not done",
                         reason="DENIED")
        self.note = note
        self.entry = entry
        self.approval = entry.approval

    def for_model(self) -> dict[str, Any]:
        """What the model reads: declined, not done, do not retry it unchanged."""
        return {"status": "denied", "note": self.note}


# --- what an action raises --------------------------------------------------------------------


class BeforeActing(Exception):  # noqa: N818 (a wrapper, not an error of its own)
    """Raised by an action's own set-up code, before it could have acted, around the real error:
    ``run_once`` records the attempt ``FAILED`` and retryable (not ``UNKNOWN``) and re-raises the
    real error. The tool wrapper and the adapters use it for their own failures."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _ActionFailure(LedgerError):
    """Base of the exceptions an action raises to say how it failed. ``run_once`` records the
    failure, sets ``entry`` to the entry as completed, and re-raises."""

    entry: Entry | None = None

    def __init__(self, message: str = "") -> None:
        super().__init__(message)


class NotExecuted(_ActionFailure):
    """Raise from an action when the effect certainly did not happen (the payments API refused
    the request before acting, a validation failed): ``run_once`` completes the entry
    ``FAILED`` and retryable, so the next call of the same intent runs the action again."""


class PermanentFailure(_ActionFailure):
    """Raise from an action when the effect did not and will not happen in this intent (the
    customer does not exist): ``run_once`` completes the entry ``FAILED``, not retryable, so
    every repeat gets :class:`PreviouslyFailedError` with this error."""


# --- decoding ---------------------------------------------------------------------------------

_BY_CODE: dict[grpc.StatusCode, type[LedgerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.DATA_LOSS: DataLoss,
}
# A reason selects a subclass only under its own code: a reason the server one day sends with
# another code must not turn, say, an UNAVAILABLE into a FailedPrecondition.
_BY_REASON: dict[tuple[grpc.StatusCode, str], type[LedgerError]] = {
    (grpc.StatusCode.FAILED_PRECONDITION, "KEY_REUSED_WITH_DIFFERENT_REQUEST"): KeyReused,
    (grpc.StatusCode.FAILED_PRECONDITION, "STALE_CLAIM_TOKEN"): StaleClaimToken,
    (grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_RESOLVED"): AlreadyResolved,
    (grpc.StatusCode.FAILED_PRECONDITION, "LEASE_ENDED"): LeaseEnded,
    (grpc.StatusCode.FAILED_PRECONDITION, "APPROVAL_MISMATCH"): ApprovalMismatch,
    (grpc.StatusCode.FAILED_PRECONDITION, "ALREADY_DECIDED"): AlreadyDecided,
    (grpc.StatusCode.FAILED_PRECONDITION, "NOT_AWAITING_APPROVAL"): NotAwaitingApproval,
    (grpc.StatusCode.PERMISSION_DENIED, "APPROVER_ROLE_REQUIRED"): ApproverRoleRequired,
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "STORE_FULL"): StoreFull,
}


_Details = tuple[str | None, str | None, float | None, tuple[Any, ...], str]


def _decode_details(trailers: Any) -> _Details:
    """(reason, field, retry_after, details, message) from the status-details trailer."""
    raw = next((v for k, v in (trailers or ()) if k == _DETAILS_TRAILER), None)
    if raw is None:
        return None, None, None, (), ""
    status = status_pb2.Status.FromString(raw)
    reason = field = retry_after = None
    details: list[Any] = []
    for any_detail in status.details:
        for cls in (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest,
                    error_details_pb2.RetryInfo):
            if any_detail.Is(cls.DESCRIPTOR):
                message = cls()
                any_detail.Unpack(message)
                details.append(message)
                if isinstance(message, error_details_pb2.ErrorInfo):
                    reason = message.reason or None
                elif isinstance(message, error_details_pb2.BadRequest):
                    if message.field_violations:
                        field = message.field_violations[0].field or None
                else:
                    retry_after = message.retry_delay.ToTimedelta().total_seconds()
                break
    return reason, field, retry_after, tuple(details), status.message


def error_from_rpc(error: grpc.RpcError) -> LedgerError:
    """The typed error for a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    reason, field, retry_after, details, status_message = _decode_details(trailers)
    message = (error.details() if hasattr(error, "details") else None) or status_message
    cls = _BY_REASON.get((code, reason or "")) or _BY_CODE.get(code, InternalError)
    return cls(message or code.name, code=code, reason=reason, field=field,
               retry_after=retry_after, details=details)
