"""OpenAI Agents SDK: the run id comes from the tool's run context.
``pip install 'idempotency-ledger[openai-agents]'``.

One line per tool, under the SDK's own decorator, on a function whose first parameter is the
SDK's context (``ToolContext`` or ``RunContextWrapper``); importing this module teaches
``ledger.tool()`` that context::

    import idempotency_ledger.openai_agents  # noqa: F401 (reads the SDK's run context)

    @function_tool
    @ledger.tool(confirm=find_credit)
    async def issue_credit(ctx: ToolContext[Session], customer: str, amount: int) -> dict: ...

The wrapper leaves the context out of the recorded arguments and keys the call by the run id it
finds, in this order:

1. ``run_id`` of your context object, the one passed as ``Runner.run(agent, input,
   context=...)``: an attribute (a dataclass field) or, for a dict, the key ``"run_id"``. This is
   the way to choose it: a conversation turn, a job id, or the id of a run you resume;
2. the ``trace_id`` of ``RunConfig(trace_id=...)``, when you set one;
3. the id of the run's trace, which the SDK starts for every ``Runner.run`` while tracing is on
   (``trace_…``): a new one per run, so every run is a new intent.

With none of them (no ``run_id`` in the context and tracing disabled) nothing is claimed or done;
since the SDK turns a tool's exception into "An error occurred while running the tool. Please try
again." for the model, the developer gets an ERROR log line (once per tool) naming the fix, and
the model reads that the action was not performed, never an invitation to try again.

**Exceptions.** The SDK would tell the model to try again after any exception; the wrapper sees
it first. An exception raised once the tool started leaves the outcome UNKNOWN, and the model
reads the ledger's unknown note as the tool's output, on that call and on every repeat (with
``confirm``: the result found, or "nothing happened"). To say the tool did not act, raise
``NotExecuted`` (or anything ``from NotExecuted()``): recorded FAILED and retryable, and the SDK's
"try again" is then true.

**The SDK's own timeout.** ``function_tool(timeout=...)`` would tell the model "Tool ... timed
out after 3 seconds." whatever the tool did. When it runs out once the tool has started acting,
the wrapper stops the action (``ActionStopped``, an outcome nobody knows), the ledger settles it
with the tool's ``confirm``, and the model reads the ledger's answer, which the SDK passes on
(see :func:`sdk_timeout_of`). Before the tool acted, and with ``timeout_behavior=
"raise_exception"``, the timeout is the SDK's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents import FunctionTool, RunContextWrapper
from agents.tool_context import ToolContext
from agents.tracing import get_current_trace

from .tools import FrameworkContext, register_context

__all__ = ["run_id_of_context", "sdk_timeout_of"]


def run_id_of_context(value: RunContextWrapper[Any]) -> str | None:
    """The run id the SDK's run context carries (see the module's documentation), or None."""
    context = value.context
    run_id = context.get("run_id") if isinstance(context, Mapping) else getattr(
        context, "run_id", None)
    if run_id:
        return str(run_id)
    run_config = value.run_config if isinstance(value, ToolContext) else None
    if run_config is not None and run_config.trace_id:
        return str(run_config.trace_id)
    trace = get_current_trace()
    # Tracing off gives a NoOpTrace whose id ("no-op") every run shares: never a run id.
    if trace is not None and trace.trace_id and trace.trace_id.startswith("trace_"):
        return str(trace.trace_id)
    return None


def sdk_timeout_of(value: RunContextWrapper[Any]) -> float | None:
    """The ``function_tool(timeout=...)`` of the tool call `value` is the context of, when the
    SDK would answer its running out with text for the model (``timeout_behavior``
    ``"error_as_result"``, the default): the tool found by name among the running agent's."""
    if not isinstance(value, ToolContext) or value.agent is None:
        return None
    for tool in getattr(value.agent, "tools", None) or ():
        if isinstance(tool, FunctionTool) and tool.name == value.tool_name:
            if tool.timeout_seconds and tool.timeout_behavior == "error_as_result":
                return float(tool.timeout_seconds)
            return None
    return None


register_context(FrameworkContext(
    framework="openai-agents", context_type=RunContextWrapper, run_id=run_id_of_context,
    raises_reach_developer=False, call_timeout=sdk_timeout_of,
    run_id_hint=("give the context you pass to Runner.run(..., context=...) a run_id, or set "
                 "RunConfig(trace_id=...), or leave tracing on")))
