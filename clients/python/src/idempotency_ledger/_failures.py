"""How an action's failure is recorded: what its exception says about whether it acted
(:func:`classify`: ``NotExecuted``, the ``not_executed`` classes, ``PermanentFailure``, or
unknown), the error text stored, and whether an action stopped may still land
(:func:`may_still_land`). Pure functions of the exception, used by run_once (``_run_once``) and
the adapters."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

from .errors import (
    ActionStopped,
    ActionTimeout,
    BeforeActing,
    NotExecuted,
    PermanentFailure,
    _ActionFailure,
)
from .model import Status

#: The longest error text stored for a failed action.
MAX_ERROR_CHARS = 4096


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


def may_still_land(error: BaseException) -> bool:
    """Whether the action that raised `error` may still be running or its effect still landing:
    it outlived ``action_timeout`` (:class:`ActionTimeout`), its framework's timeout stopped it
    (:class:`ActionStopped`), or it was cancelled. A read that finds nothing then is no proof
    that nothing happened."""
    return any(isinstance(e, (ActionTimeout, ActionStopped, asyncio.CancelledError,
                              futures.CancelledError)) for e in causes(error))
