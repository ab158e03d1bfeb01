"""LangChain v1 agents: a middleware makes every tool call run once per run.
``pip install 'idempotency-ledger[langchain]'``.

One line per agent::

    agent = create_agent(model, tools=[issue_credit, send_reply],
                         middleware=[LedgerMiddleware(ledger)])
    agent.invoke({"messages": [...]}, config={"run_id": run_id})

``LedgerMiddleware.wrap_tool_call`` / ``awrap_tool_call`` claim each tool call (the model's tool
name and arguments, as it sent them) before the tool runs, and answer the model with a
``ToolMessage``: the tool's own on a first run; on a repeat the stored content with the replay
note; for an attempt in progress, a permanent failure or an unknown outcome, the note.

**The run id** is, by ``run_id=``:

- ``"run"`` (the default): the ``run_id`` of the invocation's config (``config={"run_id": ...}``;
  LangGraph Server sets one per run). A new invocation is a new intent, as a person asking again
  is; without a ``run_id`` in the config the tool call is refused with a clear error, before
  anything is claimed;
- ``"thread"``: the config's ``thread_id`` (``config={"configurable": {"thread_id": ...}}``):
  every call of the conversation with the same arguments is one intent, across invocations; use
  it when an invocation is resumed after an interrupt or a crash and must not act again;
- a callable taking the ``ToolCallRequest`` and returning the run id.

A tool decorated with ``@ledger.tool()`` whose function takes LangChain's ``runtime: ToolRuntime``
is keyed by the same ``run_id`` of the config.

What the tool raises is re-raised after it was recorded: ``NotExecuted`` and a LangGraph
``interrupt()`` (a human approval asked before acting: the resumed tool runs from its start) as
retryable, anything else as UNKNOWN. An error ``ToolMessage`` from the tool node (by default only
an argument validation failure; also a ``ToolException`` the tool handles itself: raise it only
before acting) is recorded retryable and reaches the model as it is. Tools that return a
``Command`` cannot be replayed: leave them out with ``tools=``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime
from langgraph.types import Command

from .client import BeforeActing
from .codec import to_jsonable
from .errors import PreviouslyFailedError
from .model import Result
from .tools import NoRunId, run_options, run_tool_call, run_tool_call_sync

if TYPE_CHECKING:
    from .client import AsyncLedger, Ledger

__all__ = ["LedgerMiddleware", "is_not_executed", "run_id_of_context"]


def run_id_of_context(value: Any) -> tuple[bool, str | None]:
    """(is it LangChain's tool runtime, the run id of the invocation's config)."""
    if isinstance(value, ToolRuntime):
        info = value.execution_info
        return True, (info.run_id if info is not None else None) or _config_run_id(value.config)
    return False, None


def is_not_executed(error: BaseException) -> bool:
    """A LangGraph interrupt pauses the tool before it acts; the resumed run calls it anew."""
    return isinstance(error, GraphInterrupt)


def _config_run_id(config: Any) -> str | None:
    run_id = (config or {}).get("run_id")
    return str(run_id) if run_id else None


class _ErrorMessage(Exception):  # noqa: N818 (carries a message, is not an error of ours)
    """The tool node answered with an error ToolMessage: the tool did not run."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(str(message.content))
        self.message = message


class LedgerMiddleware(AgentMiddleware[Any, Any]):
    """Makes the agent's tool calls run once per intent (every tool, or those named in `tools`).

    Args:
        ledger: a :class:`~idempotency_ledger.Ledger` (sync and async agents) or an
            :class:`~idempotency_ledger.AsyncLedger` (``ainvoke`` only, in its event loop).
        tools: the names of the tools to make run-once; ``None``: all of them.
        run_id: ``"run"``, ``"thread"`` or a callable; see the module's documentation.
        options: the ``run_once`` options (``wait``, ``lease``, ``action_timeout``, ...).
    """

    def __init__(self, ledger: Ledger | AsyncLedger, *, tools: Collection[str] | None = None,
                 run_id: str | Callable[[ToolCallRequest], str | None] = "run",
                 **options: Any) -> None:
        super().__init__()
        if run_id not in ("run", "thread") and not callable(run_id):
            raise ValueError(f"run_id must be 'run', 'thread' or a callable, not {run_id!r}")
        self.ledger = ledger
        # Not `self.tools`: that is AgentMiddleware's list of tools a middleware adds.
        self.tool_names = None if tools is None else frozenset(tools)
        self.run_id = run_id
        self.options = run_options(**options)

    def _applies(self, request: ToolCallRequest) -> bool:
        return self.tool_names is None or request.tool_call["name"] in self.tool_names

    def _run_id(self, request: ToolCallRequest) -> str:
        if callable(self.run_id):
            run_id = self.run_id(request)
        else:
            runtime = request.runtime
            info = runtime.execution_info if runtime is not None else None
            config = runtime.config if runtime is not None else {}
            if self.run_id == "thread":
                run_id = (info.thread_id if info is not None else None) or (
                    config.get("configurable") or {}).get("thread_id")
            else:
                run_id = (info.run_id if info is not None else None) or _config_run_id(config)
        if not run_id:
            where = ('config={"configurable": {"thread_id": ...}}' if self.run_id == "thread"
                     else 'config={"run_id": ...}')
            raise NoRunId(f"tool {request.tool_call['name']}: no run id to key the call by: "
                          f"invoke the agent with {where}")
        return str(run_id)

    def _present(self, request: ToolCallRequest, produced: list[ToolMessage]) -> Callable[
            [Any], ToolMessage]:
        call = request.tool_call

        def present(outcome: Any) -> ToolMessage:
            if isinstance(outcome, Result) and not outcome.replayed and produced:
                return produced[0]  # the tool's own message, as without the ledger
            failed = isinstance(outcome, PreviouslyFailedError)
            view = outcome.for_model()
            if isinstance(outcome, Result) and isinstance(outcome.value, str):
                # The tool node stored JSON text: replay it as JSON, not as a quoted string.
                try:
                    view["result"] = json.loads(outcome.value)
                except ValueError:
                    pass
            return ToolMessage(content=json.dumps(view, ensure_ascii=False),
                               tool_call_id=call["id"], name=call["name"],
                               status="error" if failed else "success")

        return present

    @staticmethod
    def _stored(message: ToolMessage | Command[Any]) -> Any:
        if isinstance(message, Command):
            raise TypeError("the tool returned a Command, which the ledger cannot replay: "
                            "leave the tool out with LedgerMiddleware(tools=...)")
        if message.status == "error":
            raise BeforeActing(_ErrorMessage(message))
        return message.content

    def wrap_tool_call(self, request: ToolCallRequest,
                       handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
                       ) -> ToolMessage | Command[Any]:
        """Claims the call, runs the tool through `handler` if the claim is won."""
        if not self._applies(request):
            return handler(request)
        produced: list[ToolMessage] = []

        def act() -> Any:
            message = handler(request)
            if isinstance(message, ToolMessage):
                produced.append(message)
            return self._stored(message)

        try:
            return run_tool_call_sync(
                self.ledger, run_id=self._run_id(request), tool=request.tool_call["name"],
                arguments=to_jsonable(request.tool_call["args"]), act=act,
                options=self.options, present=self._present(request, produced))  # type: ignore[arg-type]
        except _ErrorMessage as refused:
            return refused.message

    async def awrap_tool_call(
            self, request: ToolCallRequest,
            handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        """The async form of :meth:`wrap_tool_call`."""
        if not self._applies(request):
            return await handler(request)
        produced: list[ToolMessage] = []

        async def act() -> Any:
            message = await handler(request)
            if isinstance(message, ToolMessage):
                produced.append(message)
            return self._stored(message)

        try:
            result: ToolMessage = await run_tool_call(
                self.ledger, run_id=self._run_id(request), tool=request.tool_call["name"],
                arguments=to_jsonable(request.tool_call["args"]), act=act,
                options=self.options, present=self._present(request, produced))
        except _ErrorMessage as refused:
            return refused.message
        return result

