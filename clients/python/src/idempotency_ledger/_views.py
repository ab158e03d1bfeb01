"""What the model reads of a ledger tool's call (:func:`model_view`), what the framework is
left to raise (:func:`raise_for_framework`), and a call refused for want of a run id
(:class:`NoRunId`, :func:`missing_run_id`). Exported from ``tools``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from ._core import NOT_PERFORMED_NOTE
from .errors import UNKNOWN_NOTE, ResultNotEncodable
from .model import CallOutcome, Kind

log = logging.getLogger("idempotency_ledger")


class NoRunId(LookupError):  # noqa: N818 (reads as the sentence it raises)
    """A ledger tool was called without a run id to key it by; nothing was claimed. A
    developer's error: the message names the fix."""


_missing_logged: set[str] = set()
_missing_lock = threading.Lock()


def missing_run_id(tool: str, fix: str) -> NoRunId:
    """The error of a call without a run id, logged at ERROR once per tool: a developer's error,
    which some frameworks would otherwise only show the model."""
    error = NoRunId(f"ledger tool {tool}: no run id to key the call by, so a repeat cannot be "
                    f"told from a new request; nothing was done. {fix}")
    with _missing_lock:
        first = tool not in _missing_logged
        _missing_logged.add(tool)
    if first:
        log.error("%s", error)
    return error


def missing_run_id_view(tool: str) -> dict[str, str]:
    """What the model reads of a call refused for want of a run id, where the framework would
    turn the exception into "try again" (the same words as the TypeScript client)."""
    return {"status": "not_executed",
            "note": (f"This action was not performed: the tool {tool} was called without a run "
                     "id, so the idempotency ledger cannot tell a repeat from a new request. "
                     "Nothing happened.")}


def model_view(outcome: CallOutcome[Any]) -> Any:
    """What the model reads of an outcome: the result itself (performed, or found by
    ``confirm``); on a repeat ``{"status": "already_done", "note", "result"}``; otherwise
    ``{"status": "in_progress" | "outcome_unknown" | "previously_failed" | "not_executed" |
    "awaiting_approval" | "denied", "note", ...}``. What the tool says did not act, or failed for good now, is re-raised for the
    framework (see :func:`raise_for_framework`)."""
    kind = outcome.kind
    if kind in (Kind.PERFORMED, Kind.CONFIRMED):
        return outcome.value
    if kind == Kind.REPLAYED:
        return {"status": "already_done", "note": outcome.note, "result": outcome.value}
    if kind == Kind.IN_PROGRESS:
        return {"status": "in_progress", "note": outcome.note,
                "retry_after_seconds": outcome.retry_after}
    if kind == Kind.PREVIOUSLY_FAILED:
        return {"status": "previously_failed", "note": outcome.note}
    if kind == Kind.AWAITING_APPROVAL:
        # A person has been asked; nothing was done (the server's note, with decide_by).
        return {"status": "awaiting_approval", "note": outcome.note}
    if kind == Kind.DENIED:
        # A person declined it; it was not done (the server's note, with the reason).
        return {"status": "denied", "note": outcome.note}
    if kind == Kind.NOT_FOUND:
        return {"status": "not_executed", "note": NOT_PERFORMED_NOTE}
    if kind == Kind.UNKNOWN:
        raise_for_framework(outcome)
        return {"status": "outcome_unknown", "note": outcome.note or UNKNOWN_NOTE}
    raise_for_framework(outcome)
    raise AssertionError(f"unreachable: {kind}")


def raise_for_framework(outcome: CallOutcome[Any]) -> None:
    """Raises what the framework must see: what the tool said did not act or failed for good
    (the framework treats it as it always does), a result that cannot be stored (a bug), a
    cancellation. An exception the tool raised after it may have acted is not raised: it is
    logged, and the model reads the unknown note."""
    error = outcome.error
    if outcome.kind in (Kind.NOT_EXECUTED, Kind.FAILED) and error is not None:
        raise error
    if outcome.kind == Kind.UNKNOWN and outcome.acted and error is not None:
        if isinstance(error, ResultNotEncodable) or not isinstance(error, Exception):
            raise error
        key = outcome.entry.key if outcome.entry is not None else "?"
        log.warning("a ledger tool raised after it may have acted; its outcome is UNKNOWN "
                    "(entry %s) and the model is told not to repeat it: %r", key, error,
                    exc_info=error)
