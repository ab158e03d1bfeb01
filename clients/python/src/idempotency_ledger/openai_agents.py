"""OpenAI Agents SDK: the run id comes from the tool's run context.
``pip install 'idempotency-ledger[openai-agents]'``.

One line per tool, under the SDK's own decorator, on a function whose first parameter is the
SDK's context (``ToolContext`` or ``RunContextWrapper``)::

    @function_tool
    @ledger.tool()
    async def issue_credit(ctx: ToolContext[Session], customer: str, amount: int) -> dict: ...

The wrapper leaves the context out of the recorded arguments and keys the call by the run id it
finds, in this order:

1. ``run_id`` of your context object, the one passed as ``Runner.run(agent, input,
   context=...)``: an attribute (a dataclass field) or, for a dict, the key ``"run_id"``. This is
   the way to choose it: a conversation turn, a job id, or the id of a run you resume;
2. the ``trace_id`` of ``RunConfig(trace_id=...)``, when you set one;
3. the id of the run's trace, which the SDK starts for every ``Runner.run`` while tracing is on
   (``trace_…``): a new one per run, so every run is a new intent.

With none of them (no ``run_id`` in the context and tracing disabled) the call raises
:class:`~idempotency_ledger.NoRunId` before anything is claimed. (A tool without the context
parameter can still take ``run_id=`` or run inside ``run_scope()``.)

The SDK turns a tool's exception into a message for the model (``failure_error_function``); the
wrapper sees the exception first, so a ``NotExecuted`` is recorded retryable and the model's next
call of the same intent runs again, while any other exception leaves the outcome UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents import RunContextWrapper
from agents.tool_context import ToolContext
from agents.tracing import get_current_trace

__all__ = ["is_not_executed", "run_id_of_context"]


def run_id_of_context(value: Any) -> tuple[bool, str | None]:
    """(is it the SDK's run context, the run id it carries; see the module's documentation)."""
    if not isinstance(value, RunContextWrapper):
        return False, None
    context = value.context
    run_id = context.get("run_id") if isinstance(context, Mapping) else getattr(
        context, "run_id", None)
    if run_id:
        return True, str(run_id)
    run_config = value.run_config if isinstance(value, ToolContext) else None
    if run_config is not None and run_config.trace_id:
        return True, run_config.trace_id
    trace = get_current_trace()
    # Tracing off gives a NoOpTrace whose id ("no-op") every run shares: never a run id.
    if trace is not None and trace.trace_id and trace.trace_id.startswith("trace_"):
        return True, trace.trace_id
    return True, None


def is_not_executed(error: BaseException) -> bool:
    """The SDK has no exception of its own that says a tool did not act."""
    return False
