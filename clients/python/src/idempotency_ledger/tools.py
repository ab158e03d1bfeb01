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
import threading
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ._confirm import check_confirm, confirm_required
from ._core import NOT_PERFORMED_NOTE
from ._frameworks import (
    FrameworkContext,
    FrameworkTimeout,
    framework_context,
    framework_not_executed,
    register_context,
    unregistered_framework,
)
from ._wire import Seconds
from .client import DEFAULT_CONFIRM_DELAY, DEFAULT_WAIT, AsyncLedgerClient, LedgerClient
from .codec import JSON, Codec, to_jsonable
from .errors import UNKNOWN_NOTE, LedgerError, ResultNotEncodable
from .keys import derive_key
from .model import Attempt, CallOutcome, Canonicalization, ClaimResult, Kind, UnknownAttempt

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
_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "idempotency_ledger.run_id", default=None)


class NoRunId(LookupError):  # noqa: N818 (reads as the sentence it raises)
    """A ledger tool was called without a run id to key it by; nothing was claimed. A
    developer's error: the message names the fix."""


def current_attempt() -> Attempt:
    """The attempt of the ledger tool running now: ``.key``, ``.external_ref`` (pass it to the
    external system as its idempotency key or memo), ``.number``. Raises ``LookupError`` outside
    a ledger tool's action."""
    attempt = _attempt.get()
    if attempt is None:
        raise LookupError("current_attempt() is set only while a ledger tool's action runs")
    return attempt


def current_run_id() -> str | None:
    """The run id set by the innermost :func:`run_scope`, if any."""
    return _run_id.get()


@contextmanager
def run_scope(run_id: str) -> Iterator[str]:
    """Ledger tools called inside key their calls by `run_id` (unless given ``run_id=``)::

        with run_scope(f"{conversation_id}:{turn}"):
            agent.run_sync(prompt)
    """
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_scope needs a non-empty run id, not {run_id!r}")
    token = _run_id.set(run_id)
    try:
        yield run_id
    finally:
        _run_id.reset(token)


# --- the paired read, registered with the tool ------------------------------------------------


@dataclass(frozen=True)
class LedgerTool:
    """A tool as the ledger knows it: its name and its paired read. The
    :class:`~idempotency_ledger.Reconciler` settles the entries of the tools it is given that
    have a ``confirm``."""

    name: str
    confirm: Confirm | None = None
    codec: Codec = JSON

    def __post_init__(self) -> None:
        if self.confirm is not None:
            check_confirm(self.confirm, self.name)


def checked_confirms(confirm: Mapping[str, Confirm] | None) -> dict[str, Confirm]:
    """The paired reads an adapter is given by tool name, each checked (:func:`check_confirm`)
    when it is registered, as ``ledger.tool(confirm=...)`` checks its own."""
    checked = dict(confirm or {})
    for name, read in checked.items():
        if read is not None:
            check_confirm(read, name)
    return checked


# Every tool registered in this process by name (the last registration wins): how a framework's
# tool object (which may not keep the function it wraps) is found again by its name.
_REGISTERED: dict[str, LedgerTool] = {}
_REGISTERED_LOCK = threading.Lock()


def registered(name: str) -> LedgerTool | None:
    """The tool registered under `name` in this process, if any."""
    return _REGISTERED.get(name)


def _register(tool: LedgerTool) -> None:
    with _REGISTERED_LOCK:
        _REGISTERED[tool.name] = tool


def require_confirm(ledger: LedgerClient | AsyncLedgerClient, name: str,
                    confirm: Confirm | None) -> None:
    """Strict mode (``require_confirm=True``): refuses a tool without its paired read."""
    if getattr(ledger, "require_confirm", False) and confirm is None:
        raise confirm_required(name)


def ledger_tools_of(item: Any) -> list[LedgerTool]:
    """The ledger tools `item` stands for: a :class:`LedgerTool`; a function made by
    ``ledger.tool()``; a framework's tool object around one (found by its ``name``); an
    adapter's middleware or toolset (its ``ledger_tools``); a mapping of tool names to
    ``confirm`` functions; or an iterable of any of these."""
    if isinstance(item, LedgerTool):
        return [item]
    own = getattr(item, "ledger_tool", None)
    if isinstance(own, LedgerTool):
        return [own]
    many = getattr(item, "ledger_tools", None)
    if many is not None and not callable(many):
        return [t for entry in many for t in ledger_tools_of(entry)]
    if isinstance(item, Mapping):
        return [LedgerTool(str(name), confirm) for name, confirm in item.items()]
    name = getattr(item, "name", None)
    if isinstance(name, str) and registered(name) is not None:
        return [cast(LedgerTool, registered(name))]
    if isinstance(item, (list, tuple, set, frozenset)):
        return [t for entry in item for t in ledger_tools_of(entry)]
    raise TypeError(f"{item!r} is not a ledger tool: give ledger.tool() functions (or the "
                    "framework tools made from them), LedgerTool(name, confirm), an adapter's "
                    "middleware or toolset, or a mapping of tool names to confirm functions")


# --- what the model reads ---------------------------------------------------------------------

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


# --- claims won by an adapter's approval check, handed to the tool call that follows --------

_HANDED_OFF: dict[str, ClaimResult] = {}
_HANDED_OFF_LOCK = threading.Lock()


def hand_off(claimed: ClaimResult) -> None:
    """Keeps a claim an adapter's approval check won (the OpenAI Agents SDK's ``needs_approval``
    claims to learn whether a person must decide): the tool call of the same key that follows
    acts on it instead of claiming again."""
    with _HANDED_OFF_LOCK:
        _HANDED_OFF[claimed.key] = claimed


def withdraw_handed_off(claimed: ClaimResult) -> bool:
    """Takes back a claim handed off that no tool call took (True: it was still there)."""
    with _HANDED_OFF_LOCK:
        if _HANDED_OFF.get(claimed.key) is claimed:
            del _HANDED_OFF[claimed.key]
            return True
    return False


def take_handed_off(run_id: str, tool: str, arguments: Any,
                    options: Mapping[str, Any]) -> ClaimResult | None:
    """The claim handed off for this call's key, if any (taken: used once)."""
    if not _HANDED_OFF:
        return None
    try:
        key = derive_key(run_id, tool, to_jsonable(arguments),
                         str(options.get("canonicalization") or Canonicalization.JCS))
    except Exception:
        return None
    with _HANDED_OFF_LOCK:
        return _HANDED_OFF.pop(key, None)


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


@dataclass(frozen=True)
class _Prepared:
    """One call of a decorated function, ready for the ledger."""

    run_id: str
    arguments: dict[str, Any]
    #: The framework's own timeout of the call (its name, seconds), if it has one.
    framework_timeout: tuple[str, float] | None
    #: The framework's context among the arguments (and how it is read), if any.
    context: FrameworkContext | None = None
    context_value: Any = None


class _ToolCall:
    """How one decorated function is called through the ledger: its signature, what it records,
    and where its run id comes from."""

    def __init__(self, fn: Callable[..., Any], name: str | None, run_id: Any,
                 exclude: Collection[str], not_executed: tuple[type[BaseException], ...],
                 confirm: Confirm | None, options: dict[str, Any]) -> None:
        if not callable(fn):
            raise TypeError(f"ledger.tool() decorates a function, not {fn!r}")
        if run_id is not None and not (isinstance(run_id, str) and run_id) and not callable(
                run_id):
            raise TypeError(f"run_id must be a non-empty str or a callable, not {run_id!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or ""
        if not self.name:
            raise ValueError(f"{fn!r} has no __name__: give the tool a name")
        if confirm is not None:
            check_confirm(confirm, self.name)
        self.signature = _signature(fn)
        unknown = set(exclude) - set(self.signature.parameters)
        if unknown:
            raise ValueError(f"exclude names no parameter of {self.name}: {sorted(unknown)}")
        self.exclude = frozenset(exclude)
        self.run_id_option = run_id
        self.not_executed = not_executed
        self.confirm = confirm
        self.options = options

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Prepared | dict[str, str]:
        """The run id, recorded arguments and framework timeout of one call, or what the model
        reads of a call refused for want of a run id where the framework would hide the
        exception from the developer; raises before anything is claimed."""
        bound = self.signature.bind(*args, **kwargs)  # the framework's TypeError, as without us
        arguments: dict[str, Any] = {}
        context_run_id: str | None = None
        context: FrameworkContext | None = None
        context_value: Any = None
        timeout: tuple[str, float] | None = None
        for pname, value in bound.arguments.items():
            if pname in self.exclude:
                continue
            found = framework_context(value)
            if found is not None:
                if context is None:
                    context, context_value = found, value
                context_run_id = context_run_id or found.run_id(value)
                seconds = found.call_timeout(value) if found.call_timeout else None
                timeout = timeout or ((found.framework, seconds) if seconds else None)
                continue
            adapter = unregistered_framework(value)
            if adapter is not None:
                raise missing_run_id(
                    self.name, f"Its parameter {pname!r} is a framework's context, whose run id "
                    f"the ledger reads once its adapter is imported: import {adapter}")
            kind = self.signature.parameters[pname].kind
            try:
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(to_jsonable(value))
                else:
                    arguments[pname] = to_jsonable(value)
            except TypeError as e:
                raise TypeError(f"ledger tool {self.name}: argument {pname!r} cannot be recorded "
                                f"as JSON: {e} (or leave it out with exclude=)") from None
        run_id = self._run_id(context_run_id)
        if run_id is not None:
            return _Prepared(run_id, arguments, timeout, context, context_value)
        hint = context.run_id_hint if context is not None else (
            "give the function the framework's context parameter (see the idempotency_ledger "
            "adapters)")
        error = missing_run_id(self.name, f"Pass run_id= to ledger.tool(), call it inside "
                                          f"run_scope(run_id), or {hint}")
        if context is not None and not context.raises_reach_developer:
            return missing_run_id_view(self.name)
        raise error

    def _run_id(self, from_context: str | None) -> str | None:
        option = self.run_id_option
        run_id = option() if callable(option) else option
        run_id = run_id or _run_id.get() or from_context
        if isinstance(run_id, uuid.UUID):
            run_id = str(run_id)
        if not run_id:
            return None
        if not isinstance(run_id, str):
            raise TypeError(f"ledger tool {self.name}: the run id must be a str or a UUID, not "
                            f"{type(run_id).__name__}")
        return run_id


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The function's signature, with string annotations (``from __future__ import annotations``)
    evaluated where they can be, as a framework that evaluates them would see it."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # a name only imported under TYPE_CHECKING: keep the strings
        return inspect.signature(fn)


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
        call = _ToolCall(fn, name, run_id, exclude, not_executed, confirm, checked)
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


def _sync_wrapper(ledger: LedgerClient, call: _ToolCall) -> Callable[..., Any]:
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


def _pauses(prepared: _Prepared) -> bool:
    return prepared.context is not None and prepared.context.on_awaiting is not None


def _pause(prepared: _Prepared, outcome: CallOutcome[Any]) -> None:
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


def _async_wrapper(ledger: LedgerClient | AsyncLedgerClient, call: _ToolCall,
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
