"""How ``ledger.tool()`` meets the agent frameworks without importing one: the registry of their
context parameters (each adapter registers its own when imported; pydantic-ai's ``RunContext``
is known by its class alone), and a framework's own timeout of a tool call that the ledger's
answer must outlast."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .errors import ActionStopped
from .model import CallOutcome

__all__ = [
    "FrameworkContext",
    "FrameworkTimeout",
    "framework_context",
    "framework_not_executed",
    "register_context",
    "unregistered_framework",
]

log = logging.getLogger("idempotency_ledger")


@dataclass(frozen=True)
class FrameworkContext:
    """How a framework's context parameter names the run; each adapter module registers its
    own (:func:`register_context`) when it is imported, so this layer never imports one."""

    #: The framework's name, for messages ("pydantic-ai").
    framework: str
    #: The context's class: a parameter holding an instance is the framework's context, left
    #: out of the recorded arguments.
    context_type: type
    #: The run id the context carries, or None.
    run_id: Callable[[Any], str | None]
    #: The framework's exceptions that mean the tool did not act (an approval asked first).
    not_executed: tuple[type[BaseException], ...] = ()
    #: False for a framework that turns every exception of a tool into "try again" text for
    #: the model: a missing run id is then logged and told to the model as what it is.
    raises_reach_developer: bool = True
    #: How to give the run an id, for the message of a missing one.
    run_id_hint: str = ""
    #: The framework's own timeout of the tool call this context belongs to, in seconds, when
    #: the framework has one and would turn it into text for the model (the OpenAI Agents SDK's
    #: ``function_tool(timeout=...)``): the wrapper then lets the ledger answer instead.
    call_timeout: Callable[[Any], float | None] | None = None
    #: The framework's approval step, for a call the ledger answers ``AWAITING_APPROVAL``:
    #: called with the context and the outcome, it raises the framework's "a person must
    #: approve this" (pydantic-ai's ``ApprovalRequired``, LangGraph's ``interrupt()``) or
    #: returns, and the model reads the awaiting note. The run's entries are extended first.
    on_awaiting: Callable[[Any, CallOutcome[Any]], None] | None = None


_CONTEXTS: list[FrameworkContext] = []
# The frameworks with an adapter, by the top-level module of their classes, and the adapter to
# import for them: names only, for the message when a context turns up unregistered.
_ADAPTERS = {
    "pydantic_ai": "idempotency_ledger.pydantic_ai",
    "agents": "idempotency_ledger.openai_agents",
    "langchain": "idempotency_ledger.langchain",
    "langgraph": "idempotency_ledger.langchain",
    "fastmcp": "idempotency_ledger.mcp",
}


def register_context(context: FrameworkContext) -> None:
    """Teaches ``ledger.tool()`` a framework's context parameter (the adapters call it)."""
    if context not in _CONTEXTS:
        _CONTEXTS.append(context)


def framework_context(value: Any) -> FrameworkContext | None:
    for context in _CONTEXTS:
        if isinstance(value, context.context_type):
            return context
    return _pydantic_ai_run_context(value)


def _pydantic_ai_run_context(value: Any) -> FrameworkContext | None:
    """pydantic-ai's ``RunContext``, known without its adapter imported, so that ``@agent.tool``
    over ``@ledger.tool()`` works as written (the README's first snippet): recognised by its
    class (``RunContext`` of the package ``pydantic_ai``) and read as the adapter reads it
    (``ctx.run_id``), with pydantic-ai's exceptions that ask before a tool acts (already loaded
    with it) as not executed. Registered at first sight, as the adapter registers itself."""
    cls = next((c for c in type(value).__mro__ if c.__name__ == "RunContext"
                and c.__module__.partition(".")[0] == "pydantic_ai"), None)
    if cls is None:
        return None
    exceptions = sys.modules.get("pydantic_ai.exceptions")
    not_executed = tuple(getattr(exceptions, name) for name in ("CallDeferred", "ApprovalRequired")
                         if isinstance(getattr(exceptions, name, None), type))
    context = FrameworkContext(
        framework="pydantic-ai", context_type=cls,
        run_id=pydantic_ai_run_id, not_executed=not_executed,
        on_awaiting=pydantic_ai_approval_required,
        run_id_hint="run the agent with agent.run(..., run_id=...) (pydantic-ai gives every run "
                    "one)")
    register_context(context)
    return context


def pydantic_ai_run_id(ctx: Any) -> str | None:
    """The run id a pydantic-ai tool call is keyed by: ``ctx.run_id``; for a deferred call
    resumed after its approval (``ctx.tool_call_approved``), which pydantic-ai runs in a new
    run with a new id, the id of the run whose model asked for the call (the message history's
    response holding the call's ``tool_call_id``), so that the resumed call is the same intent
    as the one a person was asked about."""
    if getattr(ctx, "tool_call_approved", False) and getattr(ctx, "tool_call_id", None):
        for message in reversed(getattr(ctx, "messages", None) or ()):
            if getattr(message, "kind", None) != "response":
                continue
            for part in getattr(message, "parts", ()):
                if (getattr(part, "part_kind", None) == "tool-call"
                        and part.tool_call_id == ctx.tool_call_id):
                    asked_in = getattr(message, "run_id", None)
                    if asked_in:
                        return str(asked_in)
    return getattr(ctx, "run_id", None) or None


def approval_metadata(outcome: CallOutcome[Any]) -> dict[str, Any]:
    """What an app needs to decide about a call the ledger holds for a person: the entry's key
    and fingerprint (to echo to ``decide``), its ``decide_by`` and the ledger's note."""
    entry = outcome.entry
    approval = entry.approval if entry is not None else None
    decide_by = approval.decide_by if approval is not None else None
    return {"idempotency_ledger": {
        "key": entry.key if entry is not None else "",
        "fingerprint": entry.fingerprint if entry is not None else "",
        "decide_by": decide_by.isoformat() if decide_by is not None else None,
        "note": outcome.note}}


def pydantic_ai_approval_required(ctx: Any, outcome: CallOutcome[Any]) -> None:
    """pydantic-ai's approval step: ``ApprovalRequired`` (the run ends with the call among its
    ``DeferredToolRequests.approvals``), with the entry's key and fingerprint as its metadata;
    unless the call was already approved in the run's state (``ctx.tool_call_approved``)
    without the ledger's approval: the model then reads the awaiting note."""
    exceptions = sys.modules.get("pydantic_ai.exceptions")
    approval_required = getattr(exceptions, "ApprovalRequired", None)
    if approval_required is None or getattr(ctx, "tool_call_approved", False):
        return
    raise approval_required(metadata=approval_metadata(outcome))


def unregistered_framework(value: Any) -> str | None:
    """The adapter module to import for a framework context nobody registered, if it is one."""
    for cls in type(value).__mro__:
        adapter = _ADAPTERS.get(cls.__module__.partition(".")[0])
        if adapter is not None and (cls.__name__.endswith(("Context", "ContextWrapper"))
                                    or cls.__name__ == "ToolRuntime"):
            return adapter
    return None


def framework_not_executed() -> tuple[type[BaseException], ...]:
    """Every registered framework's exceptions that mean a tool did not act."""
    return tuple(cls for context in _CONTEXTS for cls in context.not_executed)


# --- a framework's own timeout of a tool call ------------------------------------------------


class FrameworkTimeout:
    """A framework's own timeout of one tool call (see :func:`run_tool_call`): once it runs out
    while the tool acts, the action is stopped and the ledger's settlement is awaited."""

    def __init__(self, timeout: tuple[str, float]) -> None:
        self.framework, self.seconds = timeout
        self.started = time.monotonic()
        #: The action, while it runs; its stop, once the framework's timeout stopped it.
        self.acting: asyncio.Task[Any] | None = None
        self.began = False
        self.stopped: ActionStopped | None = None

    async def act(self, act: Callable[[], Awaitable[Any]]) -> Any:
        self.began = True
        self.acting = asyncio.ensure_future(act())
        try:
            return await self.acting
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self.stopped is not None and (me is None or not me.cancelling()):
                raise self.stopped from None
            raise
        finally:
            self.acting = None

    def ran_out(self) -> bool:
        # This call started after the framework's timer did, so it has run a little less long
        # when that timer fires: a tenth of the timeout is the margin.
        return time.monotonic() - self.started >= self.seconds * 0.9

    async def outlast(self, work: asyncio.Future[CallOutcome[Any]],
                      cancel: Callable[[], None]) -> CallOutcome[Any]:
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if not (self.began and self.ran_out()):
                cancel()
                raise
        # The framework's timeout: stop the action, and answer with the ledger's settlement.
        me = asyncio.current_task()
        if me is not None:
            me.uncancel()
        self.stopped = ActionStopped(self.framework, self.seconds)
        if self.acting is not None:
            self.acting.cancel()
        log.info("%s's timeout of %g s ran out while a ledger tool acted: the action is "
                 "stopped and the ledger settles its outcome", self.framework, self.seconds)
        return await work
