"""pydantic-ai: the run id is ``RunContext.run_id``. ``pip install 'idempotency-ledger[pydantic-ai]'``.

Two ways, one line each:

- a tool that takes the run context, decorated under the agent's own decorator::

      @agent.tool
      @ledger.tool()
      async def issue_credit(ctx: RunContext[Deps], customer: str, amount: int) -> dict: ...

  The wrapper finds the ``RunContext`` among the arguments, keys the call by ``ctx.run_id`` and
  leaves the context out of the recorded arguments;

- every tool of a toolset, by wrapping the toolset (tools that take no context too)::

      agent = Agent(model, toolsets=[LedgerToolset(toolset, ledger)])

``ctx.run_id`` is what ``agent.run(..., run_id=...)`` was given, else a fresh UUID7 per run (inside
a durable workflow, one derived from the workflow run, so a re-executed run keeps its keys). So a
new ``agent.run`` is a new intent; pass your own ``run_id`` to make a resumed or retried run the
same intent.

A tool that raises ``ModelRetry`` (the model is asked to correct its call), ``CallDeferred`` or
``ApprovalRequired`` has not acted: the attempt is recorded ``FAILED`` and retryable, so the
corrected or approved call runs.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred, ModelRetry
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from .codec import to_jsonable
from .tools import run_options, run_tool_call

if TYPE_CHECKING:
    from .client import AsyncLedger, Ledger

__all__ = ["LedgerToolset", "is_not_executed", "run_id_of_context"]

_NOT_EXECUTED = (ModelRetry, CallDeferred, ApprovalRequired)


def run_id_of_context(value: Any) -> tuple[bool, str | None]:
    """(is it pydantic-ai's run context, its run id)."""
    if isinstance(value, RunContext):
        return True, value.run_id
    return False, None


def is_not_executed(error: BaseException) -> bool:
    """Whether `error` is pydantic-ai's way of saying the tool did not act."""
    return isinstance(error, _NOT_EXECUTED)


@dataclass(init=False)  # pydantic-ai copies toolsets with dataclasses.replace: fields, own init
class LedgerToolset(WrapperToolset[Any]):
    """Makes every tool of the wrapped toolset (or those named in `tools`) run once per intent,
    keyed by ``ctx.run_id``, the tool's name and its validated arguments; what a tool returns
    reaches the model as ``for_model()``: the result, or the stored result with the replay note,
    or the note of an attempt in progress, failed before, or of unknown outcome.

    Args:
        wrapped: the toolset whose tools to wrap (a ``FunctionToolset``, an MCP server, ...).
        ledger: a :class:`~idempotency_ledger.Ledger` or an
            :class:`~idempotency_ledger.AsyncLedger` (created in the loop that runs the agent).
        tools: the names of the tools to make run-once; ``None``: all of them (read-only tools
            gain nothing but cost a claim each: leave them out).
        run_id: a callable taking the ``RunContext`` and returning the run id, instead of
            ``ctx.run_id``.
        options: the ``run_once`` options (``wait``, ``lease``, ``action_timeout``, ...).
    """

    ledger: Ledger | AsyncLedger
    tools: Collection[str] | None
    run_id: Callable[[RunContext[Any]], str | None] | None
    options: dict[str, Any]

    def __init__(self, wrapped: AbstractToolset[Any], ledger: Ledger | AsyncLedger, *,
                 tools: Collection[str] | None = None,
                 run_id: Callable[[RunContext[Any]], str | None] | None = None,
                 options: dict[str, Any] | None = None, **run_once_options: Any) -> None:
        self.wrapped = wrapped
        self.ledger = ledger
        self.tools = None if tools is None else frozenset(tools)
        self.run_id = run_id
        self.options = run_options(**{**(options or {}), **run_once_options})

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        if self.tools is not None and name not in self.tools:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        run_id = self.run_id(ctx) if self.run_id is not None else ctx.run_id
        if not run_id:
            from .tools import NoRunId

            raise NoRunId(f"tool {name}: the run context has no run id")
        return await run_tool_call(
            self.ledger, run_id=run_id, tool=name, arguments=to_jsonable(tool_args),
            act=lambda: self.wrapped.call_tool(name, tool_args, ctx, tool),
            options=self.options)
