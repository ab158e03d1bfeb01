"""One line per tool: ``@ledger.tool()`` makes a tool function run once per intent.

    @agent.tool                      # the framework's own decorator, outermost
    @ledger.tool(confirm=find_credit)   # claim, act, complete; replay on repeat; settle unknowns
    async def issue_credit(ctx: RunContext[Deps], customer: str, amount: int) -> dict:
        memo = current_attempt().external_ref     # pass it downstream
        ...

    def find_credit(attempt: UnknownAttempt) -> Confirmation:   # the paired read
        credit = payments.find(memo=attempt.external_ref)
        return found({"credit_id": credit.id}) if credit else not_found()

The wrapped function keeps its name, docstring, signature and annotations (``functools.wraps``
and ``__signature__``), so the framework builds the same JSON schema from it. When the framework
calls it:

1. **The run id** is, in this order: ``run_id=`` given to the decorator (a string, or a callable
   taking no argument); the one set by :func:`run_scope` around the call (the adapters' toolset
   and middlewares set it); the run id of the framework's own context parameter, when the function
   has one and the framework's adapter is imported (the OpenAI Agents SDK ``ToolContext``,
   LangChain's ``ToolRuntime``, FastMCP's ``Context``: see each adapter module; pydantic-ai's
   ``RunContext.run_id`` is read without its adapter). Without any, the call is refused before anything is claimed: :class:`NoRunId` is
   raised and logged (once per tool, at ERROR, naming the fix).
2. **The arguments** recorded (and keyed) are the ones the framework passes, by parameter name,
   in their JSON form (:func:`~idempotency_ledger.codec.to_jsonable`), without the framework's
   context parameter and without the names in ``exclude=``.
3. **The tool name** is ``name`` (default: the function's ``__name__``, as the frameworks name it).
4. The call goes through the ledger's ``attempt``: the function runs only when the claim is won,
   with the attempt available from :func:`current_attempt`, its lease renewed while it runs;
   and the wrapper returns what the model should read (:func:`model_view`): the result on a first
   run (also the result ``confirm`` found for an unknown outcome); on a repeat the stored result
   with the ledger's note; for an attempt in progress, a permanent failure already recorded, an
   outcome nobody knows (this call's own too: an exception raised once the function started,
   ``action_timeout``) or one ``confirm`` found did not happen, the note as a normal result,
   never an exception, which a framework would turn into "tool failed, try again". Only what
   the function says did not act (``NotExecuted``, the ``not_executed=`` classes, or anything
   raised from them) and ``PermanentFailure`` are re-raised after they are recorded, so the
   framework treats them as it always does; so is
   :class:`~idempotency_ledger.ResultNotEncodable`, a bug to fix.
5. **A call that needs a person's approval** (the server's approval policy, or
   ``require_approval=True``) acts only when the ledger's claim says ``CLAIMED``: while it
   awaits a decision the model reads ``{"status": "awaiting_approval", "note"}`` (or, where the
   framework has an approval step and its adapter registered it, that step pauses the run:
   pydantic-ai's ``ApprovalRequired``, LangGraph's ``interrupt()``; the run's entries are
   extended first), and once declined ``{"status": "denied", "note"}``. An approval held only
   in the framework's state never lets the function run.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar, cast

from ._frameworks import (
    FrameworkContext,
    FrameworkTimeout,
    framework_not_executed,
    register_context,
)

# What tools exports from its helpers, as it did when they were written here.
from ._prepare import Prepared, ToolCall, current_run_id, run_scope
from ._registry import (  # noqa: F401
    LedgerTool,
    _register,
    checked_confirms,
    hand_off,
    ledger_tools_of,
    registered,
    require_confirm,
    take_handed_off,
    withdraw_handed_off,
)
from ._views import (  # noqa: F401
    NoRunId,
    _missing_logged,
    missing_run_id,
    missing_run_id_view,
    model_view,
    raise_for_framework,
)
from ._wire import Seconds
from .client import DEFAULT_CONFIRM_DELAY, DEFAULT_WAIT, AsyncLedgerClient, LedgerClient
from .codec import JSON, Codec
from .errors import LedgerError
from .model import Attempt, CallOutcome, Canonicalization, Kind, UnknownAttempt

__all__ = [
    "AsyncLedger",
    "FrameworkContext",
    "Ledger",
    "LedgerTool",
    "NoRunId",
    "current_attempt",
    "current_run_id",
    "checked_confirms",
    "ledger_tool",
    "ledger_tools_of",
    "model_view",
    "missing_run_id",
    "register_context",
    "require_confirm",
    "run_options",
    "run_scope",
    "run_tool_call",
    "run_tool_call_sync",
]

F = TypeVar("F", bound=Callable[..., Any])
Confirm = Callable[[UnknownAttempt], Any]
log = logging.getLogger("idempotency_ledger")

_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "idempotency_ledger.attempt", default=None)

def current_attempt() -> Attempt:
    """The attempt of the ledger tool running now: ``.key``, ``.external_ref`` (pass it to the
    external system as its idempotency key or memo), ``.number``. Raises ``LookupError`` outside
    a ledger tool's action."""
    attempt = _attempt.get()
    if attempt is None:
        raise LookupError("current_attempt() is set only while a ledger tool's action runs")
    return attempt



# --- running one call -------------------------------------------------------------------------


def run_options(
    *,
    codec: Codec = JSON,
    wait: Seconds | None = DEFAULT_WAIT,
    lease: Seconds | None = None,
    retention: Seconds | None = None,
    action_timeout: Seconds | None = None,
    canonicalization: Canonicalization | str = Canonicalization.JCS,
    principal: str | None = None,
    timeout: float | None = None,
    confirm_delay: float = DEFAULT_CONFIRM_DELAY,
    require_approval: bool = False,
) -> dict[str, Any]:
    """The ``run_once`` options the wrapper and the adapters take, checked by name."""
    return {"codec": codec, "wait": wait, "lease": lease, "retention": retention,
            "action_timeout": action_timeout, "canonicalization": canonicalization,
            "principal": principal, "timeout": timeout, "confirm_delay": confirm_delay,
            "require_approval": require_approval}



def _with_attempt(attempt: Attempt, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    token = _attempt.set(attempt)
    try:
        return fn(*args, **kwargs)
    finally:
        _attempt.reset(token)


async def run_tool_call(
    ledger: LedgerClient | AsyncLedgerClient,
    *,
    run_id: str,
    tool: str,
    arguments: Any,
    act: Callable[[], Awaitable[Any]],
    options: dict[str, Any],
    not_executed: tuple[type[BaseException], ...] = (),
    confirm: Confirm | None = None,
    present: Callable[[CallOutcome[Any]], Any] = model_view,
    framework_timeout: tuple[str, float] | None = None,
) -> Any:
    """Runs one tool call through the ledger from a coroutine and returns what the model reads:
    `present` of the :class:`~idempotency_ledger.CallOutcome` (default :func:`model_view`).
    `act` starts the tool; the adapters use this.

    `framework_timeout` (the framework's name, seconds): the framework cancels the call when its
    own timeout of the tool runs out, and would tell the model "timed out" whatever happened.
    A cancellation that comes once the tool acted and that timeout ran out then stops the
    action only (it raises :class:`~idempotency_ledger.errors.ActionStopped`, an outcome nobody
    knows), the ledger settles it with `confirm`, and this returns what the model reads of that
    (the framework passes on what a cancelled call returns). Any other cancellation cancels the
    call, as without it."""
    not_executed = (*not_executed, *framework_not_executed())
    guard = FrameworkTimeout(framework_timeout) if framework_timeout else None

    async def action(attempt: Attempt) -> Any:
        token = _attempt.set(attempt)
        try:
            if guard is None:
                return await act()
            return await guard.act(act)
        finally:
            _attempt.reset(token)

    claimed = take_handed_off(run_id, tool, arguments, options)
    if isinstance(ledger, AsyncLedgerClient):
        call = ledger.attempt(run_id, tool, arguments, action, not_executed=not_executed,
                              confirm=confirm, claimed=claimed, **options)
        if guard is None:
            return present(await call)
        work = asyncio.ensure_future(call)
        return present(await guard.outlast(work, lambda: work.cancel()))
    loop = asyncio.get_running_loop()
    running: list[Any] = []

    def blocking_action(attempt: Attempt) -> Any:
        # Runs in a worker thread (the blocking ledger's calls); the coroutine itself runs on
        # the caller's loop.
        future = asyncio.run_coroutine_threadsafe(action(attempt), loop)
        running.append(future)
        return future.result()

    blocking_confirm = confirm
    if confirm is not None and _is_coroutine_function(confirm):
        def blocking_confirm(question: UnknownAttempt) -> Any:
            return asyncio.run_coroutine_threadsafe(confirm(question), loop).result()

    def cancel_running() -> None:
        for future in running:  # the thread then records the cancellation as UNKNOWN
            future.cancel()

    blocking = asyncio.to_thread(ledger.attempt, run_id, tool, arguments, blocking_action,
                                 not_executed=not_executed, confirm=blocking_confirm,
                                 claimed=claimed, **options)
    if guard is not None:
        return present(await guard.outlast(asyncio.ensure_future(blocking), cancel_running))
    try:
        outcome = await blocking
    except asyncio.CancelledError:
        cancel_running()
        raise
    return present(outcome)


def run_tool_call_sync(
    ledger: LedgerClient,
    *,
    run_id: str,
    tool: str,
    arguments: Any,
    act: Callable[[], Any],
    options: dict[str, Any],
    not_executed: tuple[type[BaseException], ...] = (),
    confirm: Confirm | None = None,
    present: Callable[[CallOutcome[Any]], Any] = model_view,
) -> Any:
    """:func:`run_tool_call` for blocking code, with the blocking client."""
    if isinstance(ledger, AsyncLedgerClient):
        raise TypeError("a blocking tool call needs the blocking Ledger, not an AsyncLedger")
    outcome = ledger.attempt(run_id, tool, arguments,
                             lambda attempt: _with_attempt(attempt, act),
                             not_executed=(*not_executed, *framework_not_executed()),
                             confirm=confirm, claimed=take_handed_off(run_id, tool, arguments,
                                                                      options), **options)
    return present(outcome)


def _is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None))  # noqa: B004 (a callable object's async __call__)


# --- the decorator ----------------------------------------------------------------------------



def _keep_signature(wrapper: Callable[..., Any], fn: Callable[..., Any],
                    signature: inspect.Signature) -> None:
    functools.update_wrapper(wrapper, fn)
    # Set as well as __wrapped__: a framework that reads __signature__ without unwrapping gets
    # the function's own, so the tool's schema is the model's arguments and nothing else.
    wrapper.__signature__ = signature  # type: ignore[attr-defined]


def ledger_tool(
    ledger: LedgerClient | AsyncLedgerClient,
    name: str | None = None,
    *,
    run_id: str | Callable[[], str | None] | None = None,
    exclude: Collection[str] = (),
    not_executed: tuple[type[BaseException], ...] = (),
    confirm: Confirm | None = None,
    **options: Any,
) -> Callable[[F], F]:
    """The decorator behind ``Ledger.tool`` and ``AsyncLedger.tool``; see the module's
    documentation.

    Args:
        name: the tool's name in the ledger (default: the function's ``__name__``).
        run_id: the run to key calls by, or a callable returning it (called per call).
        exclude: parameters that are not the model's arguments (injected dependencies).
        not_executed: exception classes the function raises only before acting (a refusal
            before acting): recorded ``FAILED`` and retryable instead of ``UNKNOWN``, also when
            what it raised was raised from one of them.
        confirm: the tool's paired read: ``confirm(attempt)`` gets an
            :class:`~idempotency_ledger.UnknownAttempt` (key, ``external_ref``, arguments,
            attempt number) and returns ``found(result)``, ``not_found()`` or ``cannot_tell()``
            (a plain or a coroutine function). It settles an unknown outcome right after it
            happens (after ``confirm_delay`` seconds) and before a repeat answers one whose
            lease ended; the :class:`~idempotency_ledger.Reconciler` uses it too.
        options: ``codec``, ``wait``, ``lease``, ``retention``, ``action_timeout``,
            ``canonicalization``, ``principal``, ``timeout``, ``confirm_delay``, as for
            ``run_once`` (:func:`run_options`).

    With a blocking :class:`~idempotency_ledger.Ledger`, a plain function stays a plain function;
    a coroutine function stays one, its ledger calls made from a worker thread so the event loop
    keeps running. With an :class:`~idempotency_ledger.AsyncLedger` the wrapper is always a
    coroutine function (a plain function runs in a thread), to be called in the event loop the
    ``AsyncLedger`` was created in. The wrapper's ``ledger_tool`` attribute is its
    :class:`LedgerTool` (name, confirm, codec), for the reconciler.
    """
    checked = run_options(**options)
    not_executed = tuple(not_executed)

    def decorate(fn: F) -> F:
        call = ToolCall(fn, name, run_id, exclude, not_executed, confirm, checked)
        require_confirm(ledger, call.name, confirm)
        spec = LedgerTool(call.name, confirm, checked["codec"])
        _register(spec)
        is_async = inspect.iscoroutinefunction(fn)
        if is_async or isinstance(ledger, AsyncLedgerClient):
            wrapper = _async_wrapper(ledger, call, is_async)
        else:
            wrapper = _sync_wrapper(ledger, call)
        _keep_signature(wrapper, fn, call.signature)
        wrapper.ledger_tool = spec  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate


# Keep the old keyword signature visible to readers and to test_parity (the defaults).
ledger_tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [p for p in inspect.signature(ledger_tool).parameters.values() if p.name != "options"]
    + [p for p in inspect.signature(run_options).parameters.values()])


def _sync_wrapper(ledger: LedgerClient, call: ToolCall) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        prepared = call.prepare(args, kwargs)
        if isinstance(prepared, dict):
            return prepared
        outcome = run_tool_call_sync(ledger, run_id=prepared.run_id, tool=call.name,
                                     arguments=prepared.arguments,
                                     act=lambda: call.fn(*args, **kwargs), options=call.options,
                                     not_executed=call.not_executed, confirm=call.confirm,
                                     present=_outcome)
        if outcome.kind == Kind.AWAITING_APPROVAL and _pauses(prepared):
            keep_paused_run_sync(ledger, prepared.run_id)
            _pause(prepared, outcome)
        return model_view(outcome)

    return wrapper


def _outcome(outcome: CallOutcome[Any]) -> CallOutcome[Any]:
    return outcome


def _pauses(prepared: Prepared) -> bool:
    return prepared.context is not None and prepared.context.on_awaiting is not None


def _pause(prepared: Prepared, outcome: CallOutcome[Any]) -> None:
    """The framework's approval step (it may raise to pause the run)."""
    assert prepared.context is not None and prepared.context.on_awaiting is not None
    prepared.context.on_awaiting(prepared.context_value, outcome)


def keep_paused_run_sync(ledger: LedgerClient, run_id: str,
                         retention: Seconds | None = None) -> None:
    """Extends a run's entries where the framework pauses it (a failure is logged: the ledger
    keeps a run with an entry awaiting a decision anyway)."""
    try:
        ledger.extend_run(run_id, retention)
    except LedgerError as e:
        log.warning("could not extend the paused run %s: %s", run_id, e)


async def keep_paused_run(ledger: LedgerClient | AsyncLedgerClient, run_id: str,
                          retention: Seconds | None = None) -> None:
    """:func:`keep_paused_run_sync` from a coroutine, with either client."""
    if isinstance(ledger, AsyncLedgerClient):
        try:
            await ledger.extend_run(run_id, retention)
        except LedgerError as e:
            log.warning("could not extend the paused run %s: %s", run_id, e)
        return
    await asyncio.to_thread(keep_paused_run_sync, ledger, run_id, retention)


def _async_wrapper(ledger: LedgerClient | AsyncLedgerClient, call: ToolCall,
                   is_async: bool) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        prepared = call.prepare(args, kwargs)
        if isinstance(prepared, dict):
            return prepared
        if is_async:
            def act() -> Awaitable[Any]:
                return cast(Awaitable[Any], call.fn(*args, **kwargs))
        else:
            context = contextvars.copy_context()

            def act() -> Awaitable[Any]:
                # A plain function on the async client: in a thread, with the attempt set.
                return asyncio.to_thread(context.run, _with_attempt, current_attempt(),
                                         call.fn, *args, **kwargs)
        outcome = await run_tool_call(ledger, run_id=prepared.run_id, tool=call.name,
                                      arguments=prepared.arguments, act=act,
                                      options=call.options, not_executed=call.not_executed,
                                      confirm=call.confirm,
                                      framework_timeout=prepared.framework_timeout,
                                      present=_outcome)
        if outcome.kind == Kind.AWAITING_APPROVAL and _pauses(prepared):
            await keep_paused_run(ledger, prepared.run_id)
            _pause(prepared, outcome)
        return model_view(outcome)

    return wrapper


# --- the clients with the decorator -----------------------------------------------------------


class Ledger(LedgerClient):
    """The blocking client (:class:`~idempotency_ledger.client.LedgerClient`: the RPCs,
    ``run_once``, ``attempt``) with :meth:`tool`, the one-line decorator of this layer."""

    def tool(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """A decorator that makes a tool function run once per intent; see :func:`ledger_tool`
        for the options. The function keeps its signature, so a framework builds the same
        schema from it::

            @ledger.tool(run_id=lambda: current_run, confirm=find_credit)
            def issue_credit(customer: str, amount: int) -> dict: ...
        """
        return ledger_tool(self, name, **options)

    def __enter__(self) -> Ledger:
        return self


class AsyncLedger(AsyncLedgerClient):
    """The asyncio client (:class:`~idempotency_ledger.client.AsyncLedgerClient`) with
    :meth:`tool`."""

    def tool(self, name: str | None = None, **options: Any) -> Callable[[F], F]:
        """See :meth:`Ledger.tool`: the wrapped function is a coroutine function (a plain one
        runs in a thread, with ``asyncio.to_thread``)."""
        return ledger_tool(self, name, **options)

    async def __aenter__(self) -> AsyncLedger:
        return self
