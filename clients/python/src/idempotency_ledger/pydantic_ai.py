"""pydantic-ai: the run id is ``RunContext.run_id``. ``pip install 'idempotency-ledger[pydantic-ai]'``.

Two ways, one line each (``ledger.tool()`` knows the ``RunContext`` without this module; importing
it registers the same reading):

- a tool that takes the run context, decorated under the agent's own decorator::

      @agent.tool
      @ledger.tool(confirm=find_credit)
      async def issue_credit(ctx: RunContext[Deps], customer: str, amount: int) -> dict: ...

  The wrapper finds the ``RunContext`` among the arguments, keys the call by ``ctx.run_id`` and
  leaves the context out of the recorded arguments;

- every tool of a toolset, by wrapping the toolset (tools that take no context too)::

      agent = Agent(model, toolsets=[LedgerToolset(toolset, ledger,
                                                   confirm={"issue_credit": find_credit})])

``ctx.run_id`` is what ``agent.run(..., run_id=...)`` was given, else a fresh UUID7 per run (inside
a durable workflow, one derived from the workflow run, so a re-executed run keeps its keys). So a
new ``agent.run`` is a new intent; pass your own ``run_id`` to make a resumed or retried run the
same intent.

**Exceptions.** A tool that raises once it started (``ModelRetry`` included: the code cannot know
whether the payment went through before the timeout it reports) leaves the outcome UNKNOWN, and
the model reads the ledger's unknown note as the tool's return value, on that call and on every
repeat (with ``confirm``, the outcome is settled first: the result found, or "nothing happened").
To say the tool did not act, raise the retry from ``NotExecuted``::

    raise ModelRetry("the payments API is busy, call again") from NotExecuted()

which is recorded FAILED and retryable: pydantic-ai asks the model again, and the corrected call
runs. ``CallDeferred`` and ``ApprovalRequired`` ask before the tool acts: recorded retryable.

**Approvals.** A call the ledger holds for a person (the server's approval policy, or
``ledger.tool(require_approval=True)``) uses pydantic-ai's deferred tools: the wrapper raises
``ApprovalRequired`` (its metadata, under ``"idempotency_ledger"``, carries the entry's ``key``,
``fingerprint``, ``decide_by`` and the ledger's note), so the run ends with the call in
``DeferredToolRequests.approvals`` (give the agent ``output_type=[str, DeferredToolRequests]``),
and the run's entries are extended meanwhile. The app's approve button decides with the
person's token, then resumes the run with every call answered (pydantic-ai wants them all at
once: several gated calls of one step end the run together), ``True`` for a denied call too, so
that its claim hands the model the person's reason::

    for call in requests.approvals:
        meta = requests.metadata[call.tool_call_id]["idempotency_ledger"]
        approver.decide(meta["key"], meta["fingerprint"], "approve", "checked")
    answers = DeferredToolResults(approvals={c.tool_call_id: True for c in requests.approvals})
    agent.run_sync(message_history=result.all_messages(), deferred_tool_results=answers)

pydantic-ai runs the resumed call in a new run (a new ``run_id``): the wrapper keys it by the
id of the run whose model asked for it (the message history's response holding the call), so it
is the same intent as the call the person decided about. The resumed call claims again, and only the ledger's answer counts: ``CLAIMED`` after a Decide
(it acts, once), ``DENIED`` (the model reads ``{"status": "denied", "note": ...}`` with the
person's reason); a ``ToolApproved`` without a Decide (a forged or replayed history) reads
``{"status": "awaiting_approval", "note": ...}`` and nothing acts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_ai import RunContext
from pydantic_ai.exceptions import ApprovalRequired, CallDeferred
from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
from pydantic_ai.toolsets.abstract import ToolsetTool

from ._frameworks import pydantic_ai_approval_required, pydantic_ai_run_id
from .client import AsyncLedgerClient, LedgerClient
from .codec import to_jsonable
from .model import Kind, UnknownAttempt
from .tools import (
    FrameworkContext,
    LedgerTool,
    checked_confirms,
    keep_paused_run,
    missing_run_id,
    model_view,
    register_context,
    require_confirm,
    run_options,
    run_tool_call,
)

__all__ = ["LedgerToolset", "run_id_of_context"]

#: pydantic-ai's exceptions that ask before a tool acts: it did not act.
NOT_EXECUTED = (CallDeferred, ApprovalRequired)


def run_id_of_context(value: RunContext[Any]) -> str | None:
    """The run id of pydantic-ai's run context: ``ctx.run_id``, or for a deferred call resumed
    after its approval the id of the run that asked for it (see the module's documentation)."""
    return pydantic_ai_run_id(value)


register_context(FrameworkContext(
    framework="pydantic-ai", context_type=RunContext, run_id=run_id_of_context,
    not_executed=NOT_EXECUTED, on_awaiting=pydantic_ai_approval_required,
    run_id_hint="run the agent with agent.run(..., run_id=...) (pydantic-ai gives every run one)"))


@dataclass(init=False)  # pydantic-ai copies toolsets with dataclasses.replace: fields, own init
class LedgerToolset(WrapperToolset[Any]):
    """Makes every tool of the wrapped toolset (or those named in `tools`) run once per intent,
    keyed by ``ctx.run_id``, the tool's name and its validated arguments; what a tool returns
    reaches the model as :func:`~idempotency_ledger.tools.model_view`: the result, or the stored
    result with the replay note, or the note of an attempt in progress, failed before, of unknown
    outcome or found not to have happened.

    Args:
        wrapped: the toolset whose tools to wrap (a ``FunctionToolset``, an MCP server, ...).
        ledger: a :class:`~idempotency_ledger.Ledger` or an
            :class:`~idempotency_ledger.AsyncLedger` (created in the loop that runs the agent).
        tools: the names of the tools to make run-once; ``None``: all of them (read-only tools
            gain nothing but cost a claim each: leave them out).
        confirm: each tool's paired read, by tool name (see ``ledger.tool(confirm=...)``). In
            strict mode (``require_confirm=True``) every tool named in `tools` needs one, and
            with ``tools=None`` every tool of the toolset, checked when the run lists them.
        run_id: a callable taking the ``RunContext`` and returning the run id, instead of
            ``ctx.run_id``.
        options: the ``run_once`` options (``wait``, ``lease``, ``action_timeout``,
            ``confirm_delay``, ...).
    """

    ledger: LedgerClient | AsyncLedgerClient
    tools: Collection[str] | None
    confirm: Mapping[str, Callable[[UnknownAttempt], Any]]
    run_id: Callable[[RunContext[Any]], str | None] | None
    options: dict[str, Any]

    def __init__(self, wrapped: AbstractToolset[Any], ledger: LedgerClient | AsyncLedgerClient, *,
                 tools: Collection[str] | None = None,
                 confirm: Mapping[str, Callable[[UnknownAttempt], Any]] | None = None,
                 run_id: Callable[[RunContext[Any]], str | None] | None = None,
                 options: dict[str, Any] | None = None, **run_once_options: Any) -> None:
        self.wrapped = wrapped
        self.ledger = ledger
        self.tools = None if tools is None else frozenset(tools)
        self.confirm = checked_confirms(confirm)
        self.run_id = run_id
        self.options = run_options(**{**(options or {}), **run_once_options})
        for name in self.tools or ():
            require_confirm(ledger, name, self.confirm.get(name))

    @property
    def ledger_tools(self) -> list[LedgerTool]:
        """The tools with a paired read, for the :class:`~idempotency_ledger.Reconciler`."""
        return [LedgerTool(name, confirm, self.options["codec"])
                for name, confirm in self.confirm.items()]

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        for name in tools:  # strict mode: refused when the run lists them, before any call
            if self.tools is None or name in self.tools:
                require_confirm(self.ledger, name, self.confirm.get(name))
        return tools

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        if self.tools is not None and name not in self.tools:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        run_id = self.run_id(ctx) if self.run_id is not None else run_id_of_context(ctx)
        if not run_id:
            raise missing_run_id(name, "Run the agent with agent.run(..., run_id=...), or give "
                                       "LedgerToolset a run_id= callable that finds one")
        outcome = await run_tool_call(
            self.ledger, run_id=str(run_id), tool=name, arguments=to_jsonable(tool_args),
            act=lambda: self.wrapped.call_tool(name, tool_args, ctx, tool),
            options=self.options, not_executed=NOT_EXECUTED, confirm=self.confirm.get(name),
            present=lambda outcome: outcome)
        if outcome.kind == Kind.AWAITING_APPROVAL:
            await keep_paused_run(self.ledger, str(run_id))
            pydantic_ai_approval_required(ctx, outcome)
        return model_view(outcome)
