"""One line per tool: ``@ledger.tool()`` makes a tool function run once per intent.

    @agent.tool                      # the framework's own decorator, outermost
    @ledger.tool()                   # claim, act, complete; replay on repeat
    async def issue_credit(ctx: RunContext[Deps], customer: str, amount: int) -> dict:
        memo = current_attempt().external_ref     # pass it downstream
        ...

The wrapped function keeps its name, docstring, signature and annotations (``functools.wraps``
and ``__signature__``), so the framework builds the same JSON schema from it. When the framework
calls it:

1. **The run id** is, in this order: ``run_id=`` given to the decorator (a string, or a callable
   taking no argument); the one set by :func:`run_scope` around the call (the adapters' toolset
   and middlewares set it); the run id of the framework's own context parameter, when the function
   has one (pydantic-ai ``RunContext.run_id``, the OpenAI Agents SDK ``ToolContext``, LangChain's
   ``ToolRuntime``, FastMCP's ``Context``: see each adapter module). Without any, the call raises
   :class:`NoRunId` before anything is claimed.
2. **The arguments** recorded (and keyed) are the ones the framework passes, by parameter name,
   in their JSON form (:func:`~idempotency_ledger.codec.to_jsonable`), without the framework's
   context parameter and without the names in ``exclude=``.
3. **The tool name** is ``name`` (default: the function's ``__name__``, as the frameworks name it).
4. The call goes through ``run_once``: the function runs only when the claim is won, with the
   attempt available from :func:`current_attempt` (key, ``external_ref``, attempt number), its
   lease renewed while it runs; and the wrapper returns what the model should read
   (``for_model()``): the result on a first run; on a repeat the stored result with the ledger's
   note; for an attempt in progress, a permanent failure already recorded or an outcome nobody
   knows (also this call's own ``action_timeout``), the note, never an exception, which a
   framework would turn into "tool failed, retry". An exception the function raises is re-raised
   after it was recorded (``NotExecuted`` and the ``not_executed=`` classes as retryable, anything
   else as ``UNKNOWN``); so is :class:`~idempotency_ledger.ResultNotEncodable`, a bug to fix.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import inspect
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .client import DEFAULT_WAIT, BeforeActing, Seconds
from .codec import JSON, Codec, to_jsonable
from .errors import InProgressError, PreviouslyFailedError, ResultNotEncodable
from .model import Attempt, Canonicalization

if TYPE_CHECKING:
    from .client import AsyncLedger, Ledger

__all__ = [
    "AsyncToolDecorator",
    "NoRunId",
    "ToolDecorator",
    "current_attempt",
    "current_run_id",
    "framework_not_executed",
    "framework_run_id",
    "ledger_tool",
    "run_options",
    "run_scope",
    "run_tool_call",
    "run_tool_call_sync",
]

F = TypeVar("F", bound=Callable[..., Any])
ToolDecorator = Callable[[F], F]
AsyncToolDecorator = Callable[[Callable[..., Any]], Callable[..., Awaitable[Any]]]

_attempt: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar(
    "idempotency_ledger.attempt", default=None)
_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "idempotency_ledger.run_id", default=None)

# The frameworks whose context parameter a tool may take: the top-level module of the context's
# class, and this package's adapter module that reads the run id from it. The adapter is
# imported only when such a value turns up, so the base client needs none of the frameworks.
_ADAPTERS = {
    "pydantic_ai": "idempotency_ledger.pydantic_ai",
    "agents": "idempotency_ledger.openai_agents",
    "langchain": "idempotency_ledger.langchain",
    "langgraph": "idempotency_ledger.langchain",
    "fastmcp": "idempotency_ledger.mcp",
}


class NoRunId(LookupError):  # noqa: N818 (reads as the sentence it raises)
    """A ledger tool was called without a run id to key it by; nothing was claimed."""


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


def framework_run_id(value: Any) -> tuple[bool, str | None]:
    """(whether `value` is a framework's context object, the run id it carries)."""
    for cls in type(value).__mro__:
        module = _adapter(cls)
        if module is None:
            continue
        is_context, run_id = module.run_id_of_context(value)
        if is_context:
            return True, run_id
    return False, None


def _adapter(cls: type) -> Any:
    """The adapter module for a class of one of the frameworks, or None (also when the
    framework's package is not the one the adapter is for: another package named ``agents``)."""
    adapter = _ADAPTERS.get(cls.__module__.partition(".")[0])
    if adapter is None:
        return None
    try:
        return importlib.import_module(adapter)
    except ImportError:
        return None


def framework_not_executed(error: BaseException) -> bool:
    """Whether `error` is a framework's own way of saying the tool did not act (pydantic-ai's
    ``ModelRetry``, ``CallDeferred``, ``ApprovalRequired``): recorded retryable, not UNKNOWN."""
    for cls in type(error).__mro__:
        module = _adapter(cls)
        if module is not None:
            return bool(module.is_not_executed(error))
    return False


def _causes(error: BaseException) -> list[BaseException]:
    """`error` and what it was raised from (``raise ... from``), as a framework wraps it."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__
    return chain


def _acting(attempt: Attempt, not_executed: tuple[type[BaseException], ...]) -> Any:
    """Sets the attempt for current_attempt() and sorts the action's exceptions; a context
    manager for both kinds of action."""
    return _Acting(attempt, not_executed)


class _Acting:
    def __init__(self, attempt: Attempt, not_executed: tuple[type[BaseException], ...]) -> None:
        self.attempt = attempt
        self.not_executed = not_executed

    def __enter__(self) -> None:
        self.token = _attempt.set(self.attempt)

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        _attempt.reset(self.token)
        if error is not None and not isinstance(error, BeforeActing) and any(
                isinstance(e, self.not_executed) or framework_not_executed(e)
                for e in _causes(error)):
            raise BeforeActing(error) from None


def for_model(outcome: Any) -> Any:
    """What the model reads of an outcome: ``for_model()`` of a :class:`Result` or of the
    not-a-result outcome errors."""
    return outcome.for_model()


def _for_model(outcome: Callable[[], Any], present: Callable[[Any], Any] = for_model) -> Any:
    """What the model reads: the result presented, or the note of an outcome that is not a
    result."""
    try:
        result = outcome()
    except ResultNotEncodable:
        raise
    except (InProgressError, PreviouslyFailedError) as e:
        return present(e)
    return present(result)


async def _for_model_async(outcome: Awaitable[Any],
                           present: Callable[[Any], Any] = for_model) -> Any:
    try:
        result = await outcome
    except ResultNotEncodable:
        raise
    except (InProgressError, PreviouslyFailedError) as e:
        return present(e)
    return present(result)


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
) -> dict[str, Any]:
    """The ``run_once`` options the wrapper and the adapters take, checked by name."""
    return {"codec": codec, "wait": wait, "lease": lease, "retention": retention,
            "action_timeout": action_timeout, "canonicalization": canonicalization,
            "principal": principal, "timeout": timeout}


async def run_tool_call(
    ledger: Ledger | AsyncLedger,
    *,
    run_id: str,
    tool: str,
    arguments: Any,
    act: Callable[[], Awaitable[Any]],
    options: dict[str, Any],
    not_executed: tuple[type[BaseException], ...] = (),
    present: Callable[[Any], Any] = for_model,
) -> Any:
    """Runs one tool call through the ledger from a coroutine and returns what the model reads:
    `present` of the :class:`Result`, or of the ``InProgressError`` / ``PreviouslyFailedError``
    (default: their ``for_model()``). `act` starts the tool; the adapters use this."""
    from .client import AsyncLedger

    async def action(attempt: Attempt) -> Any:
        with _acting(attempt, not_executed):
            return await act()

    if isinstance(ledger, AsyncLedger):
        return await _for_model_async(ledger.run_once(run_id, tool, arguments, action,
                                                      **options), present)
    loop = asyncio.get_running_loop()
    running: list[Any] = []

    def blocking_action(attempt: Attempt) -> Any:
        # Runs in run_once's worker thread; the coroutine itself runs on the caller's loop.
        future = asyncio.run_coroutine_threadsafe(action(attempt), loop)
        running.append(future)
        return future.result()

    blocking = asyncio.to_thread(ledger.run_once, run_id, tool, arguments, blocking_action,
                                 **options)
    try:
        return await _for_model_async(blocking, present)
    except asyncio.CancelledError:
        for future in running:  # the thread then records the cancellation as UNKNOWN
            future.cancel()
        raise


def run_tool_call_sync(
    ledger: Ledger,
    *,
    run_id: str,
    tool: str,
    arguments: Any,
    act: Callable[[], Any],
    options: dict[str, Any],
    not_executed: tuple[type[BaseException], ...] = (),
    present: Callable[[Any], Any] = for_model,
) -> Any:
    """:func:`run_tool_call` for blocking code, with the blocking client."""
    from .client import AsyncLedger

    if isinstance(ledger, AsyncLedger):
        raise TypeError("a blocking tool call needs the blocking Ledger, not an AsyncLedger")

    def action(attempt: Attempt) -> Any:
        with _acting(attempt, not_executed):
            return act()

    return _for_model(lambda: ledger.run_once(run_id, tool, arguments, action, **options),
                      present)


class _ToolCall:
    """How one decorated function is called through the ledger: its signature, what it records,
    and where its run id comes from."""

    def __init__(self, fn: Callable[..., Any], name: str | None, run_id: Any,
                 exclude: Collection[str], not_executed: tuple[type[BaseException], ...],
                 run_options: dict[str, Any]) -> None:
        if not callable(fn):
            raise TypeError(f"ledger.tool() decorates a function, not {fn!r}")
        if run_id is not None and not (isinstance(run_id, str) and run_id) and not callable(
                run_id):
            raise TypeError(f"run_id must be a non-empty str or a callable, not {run_id!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or ""
        if not self.name:
            raise ValueError(f"{fn!r} has no __name__: give the tool a name")
        self.signature = _signature(fn)
        unknown = set(exclude) - set(self.signature.parameters)
        if unknown:
            raise ValueError(f"exclude names no parameter of {self.name}: {sorted(unknown)}")
        self.exclude = frozenset(exclude)
        self.run_id_option = run_id
        self.not_executed = not_executed
        self.run_options = run_options

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(run id, recorded arguments) of one call; raises before anything is claimed."""
        bound = self.signature.bind(*args, **kwargs)  # the framework's TypeError, as without us
        arguments: dict[str, Any] = {}
        context_run_id: str | None = None
        for pname, value in bound.arguments.items():
            if pname in self.exclude:
                continue
            is_context, found = framework_run_id(value)
            if is_context:
                context_run_id = context_run_id or found
                continue
            kind = self.signature.parameters[pname].kind
            try:
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(to_jsonable(value))
                else:
                    arguments[pname] = to_jsonable(value)
            except TypeError as e:
                raise TypeError(f"ledger tool {self.name}: argument {pname!r} cannot be recorded "
                                f"as JSON: {e} (or leave it out with exclude=)") from None
        return self._run_id(context_run_id), arguments

    def _run_id(self, from_context: str | None) -> str:
        option = self.run_id_option
        run_id = option() if callable(option) else option
        run_id = run_id or _run_id.get() or from_context
        if not run_id:
            raise NoRunId(
                f"ledger tool {self.name}: no run id to key the call by. Pass run_id= to "
                "ledger.tool(), call it inside run_scope(run_id), or give the function the "
                "framework's context parameter (see the idempotency_ledger adapters)")
        if not isinstance(run_id, str):
            raise TypeError(f"ledger tool {self.name}: the run id must be a str, not "
                            f"{type(run_id).__name__}")
        return run_id

    def call_sync(self, attempt: Attempt, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with _acting(attempt, self.not_executed):
            return self.fn(*args, **kwargs)


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
    ledger: Ledger | AsyncLedger,
    name: str | None = None,
    *,
    run_id: str | Callable[[], str | None] | None = None,
    exclude: Collection[str] = (),
    not_executed: tuple[type[BaseException], ...] = (),
    **options: Any,
) -> Callable[[F], F]:
    """The decorator behind ``Ledger.tool`` and ``AsyncLedger.tool``; see the module's
    documentation.

    Args:
        name: the tool's name in the ledger (default: the function's ``__name__``).
        run_id: the run to key calls by, or a callable returning it (called per call).
        exclude: parameters that are not the model's arguments (injected dependencies).
        not_executed: exception classes that mean the function certainly did not act (a refusal
            before acting): recorded ``FAILED`` and retryable instead of ``UNKNOWN``.
        options: ``codec``, ``wait``, ``lease``, ``retention``, ``action_timeout``,
            ``canonicalization``, ``principal``, ``timeout``, as for ``run_once``
            (:func:`run_options`).

    With a blocking :class:`~idempotency_ledger.Ledger`, a plain function stays a plain function;
    a coroutine function stays one, its ledger calls made from a worker thread so the event loop
    keeps running. With an :class:`~idempotency_ledger.AsyncLedger` the wrapper is always a
    coroutine function (a plain function runs in a thread), to be called in the event loop the
    ``AsyncLedger`` was created in.
    """
    from .client import AsyncLedger

    checked = run_options(**options)
    not_executed = tuple(not_executed)

    def decorate(fn: F) -> F:
        call = _ToolCall(fn, name, run_id, exclude, not_executed, checked)
        is_async = inspect.iscoroutinefunction(fn)
        if is_async or isinstance(ledger, AsyncLedger):
            wrapper = _async_wrapper(ledger, call, is_async)
        else:
            wrapper = _sync_wrapper(ledger, call)
        _keep_signature(wrapper, fn, call.signature)
        return cast(F, wrapper)

    return decorate


# Keep the old keyword signature visible to readers and to test_parity (the defaults).
ledger_tool.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [p for p in inspect.signature(ledger_tool).parameters.values() if p.name != "options"]
    + [p for p in inspect.signature(run_options).parameters.values()])


def _sync_wrapper(ledger: Ledger, call: _ToolCall) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        run_id, arguments = call.prepare(args, kwargs)
        return _for_model(lambda: ledger.run_once(
            run_id, call.name, arguments, lambda attempt: call.call_sync(attempt, args, kwargs),
            **call.run_options))

    return wrapper


def _async_wrapper(ledger: Ledger | AsyncLedger, call: _ToolCall,
                   is_async: bool) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        run_id, arguments = call.prepare(args, kwargs)
        if is_async:
            def act() -> Awaitable[Any]:
                return cast(Awaitable[Any], call.fn(*args, **kwargs))
        else:
            context = contextvars.copy_context()

            def act() -> Awaitable[Any]:
                # A plain function on the async client: in a thread, with the attempt set.
                attempt = _attempt.get()
                return asyncio.to_thread(context.run, _with_attempt, attempt, call.fn, args,
                                         kwargs)
        return await run_tool_call(ledger, run_id=run_id, tool=call.name, arguments=arguments,
                                   act=act, options=call.run_options,
                                   not_executed=call.not_executed)

    return wrapper


def _with_attempt(attempt: Attempt | None, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    token = _attempt.set(attempt)
    try:
        return fn(*args, **kwargs)
    finally:
        _attempt.reset(token)
