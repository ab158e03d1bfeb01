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

**Approvals.** A tool the ledger may gate (the server's approval policy, or
``ledger.tool(require_approval=True)``) uses the SDK's own approval step, with the ledger as the
authority::

    issue_refund = gated(function_tool(ledger.tool()(issue_refund_fn)), ledger)

:func:`gated` sets the tool's ``needs_approval`` to ask the ledger: a Claim that answers
``AWAITING_APPROVAL`` means a person must decide, and the run stops with an interruption (the
run's entries are kept meanwhile, :meth:`~idempotency_ledger.Ledger.extend_run`); a Claim that
answers ``CLAIMED`` is handed to the tool call that follows, which acts on it. The app's approve
button decides with the person's credential, then approves each interruption in the run state
(one per gated call of the step) and resumes::

    for interruption in result.interruptions:
        entry = await awaiting_entry(approver, state, interruption)   # show the person this
        await decide(approver, state, interruption, entry.fingerprint, "approve", "checked")
    result = await Runner.run(agent, state)

:func:`decide` records the decision in the ledger, then lets the call through the SDK's gate
(``state.approve``) whatever the decision: the tool's own Claim is what decides, so an approved
call acts once, a denied one reads ``{"status": "denied", "note": ...}`` with the person's
reason, and an approval that exists only in the run state (a forged or replayed state, a state
resumed twice) never acts: its Claim answers ``AWAITING_APPROVAL`` (the model reads that
note) or replays the one result.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from agents import FunctionTool, RunContextWrapper, RunState
from agents.items import ToolApprovalItem
from agents.tool_context import ToolContext
from agents.tracing import get_current_trace

from .client import AsyncLedgerClient, LedgerClient
from ._core import granted_lease
from .errors import LedgerError
from .model import ClaimResult, Decision, Entry, Outcome, Status
from .tools import (
    FrameworkContext,
    hand_off,
    keep_paused_run,
    register_context,
    run_options,
    withdraw_handed_off,
)

log = logging.getLogger("idempotency_ledger")

__all__ = ["awaiting_entry", "decide", "gated", "run_id_of_context", "sdk_timeout_of"]


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


# --- approvals --------------------------------------------------------------------------------


def _with_defaults(tool: FunctionTool, params: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments as the tool function is called with them: the model's, with the schema's
    defaults for what it left out (the key the tool's own claim derives)."""
    arguments = dict(params)
    properties = (tool.params_json_schema or {}).get("properties") or {}
    for name, spec in properties.items():
        if name not in arguments and isinstance(spec, Mapping) and "default" in spec:
            arguments[name] = spec["default"]
    return arguments


async def _call(ledger: LedgerClient | AsyncLedgerClient, method: str, *args: Any,
                **kwargs: Any) -> Any:
    if isinstance(ledger, AsyncLedgerClient):
        return await getattr(ledger, method)(*args, **kwargs)
    return await asyncio.to_thread(getattr(ledger, method), *args, **kwargs)


def gated(tool: FunctionTool, ledger: LedgerClient | AsyncLedgerClient, *,
          pause_retention: float | None = None, **options: Any) -> FunctionTool:
    """Makes the SDK ask the ledger whether `tool` (a ``function_tool`` over ``ledger.tool()``)
    needs a person's approval: its ``needs_approval`` claims the call's key (the run id of the
    run's context, the tool's name, the model's arguments); ``AWAITING_APPROVAL`` interrupts the
    run for approval and keeps the run's entries at least `pause_retention` seconds (default:
    the server's retention; :meth:`~idempotency_ledger.Ledger.extend_run`); ``CLAIMED`` is
    handed to the tool call that follows (it acts on that claim); any other answer lets the
    tool's own claim answer the model (a replay, a denial). `options`: ``require_approval``,
    ``canonicalization``, ``principal``, ``timeout``, as given to ``ledger.tool()``."""
    checked = run_options(**options)

    async def needs_approval(context: RunContextWrapper[Any], params: dict[str, Any],
                             call_id: str) -> bool:
        run_id = run_id_of_context(context)
        if not run_id:
            return False  # the tool refuses the call itself, saying why
        claimed = await _call(
            ledger, "claim", run_id, tool.name, _with_defaults(tool, params),
            canonicalization=checked["canonicalization"], principal=checked["principal"],
            timeout=checked["timeout"], require_approval=checked["require_approval"],
            lease=checked["lease"], retention=checked["retention"])
        if claimed.outcome == Outcome.CLAIMED:
            hand_off(claimed)
            _release_if_not_taken(ledger, claimed)
            return False
        if claimed.outcome == Outcome.AWAITING_APPROVAL:
            await keep_paused_run(ledger, run_id, pause_retention)
            return True
        return False

    tool.needs_approval = needs_approval
    return tool


#: The tool call the SDK makes right after ``needs_approval`` answered False takes the claim
#: handed off to it; one not taken within this fraction of the claim's lease (the SDK never
#: called the tool: the run was cancelled) is given back as not executed, so that the entry
#: does not read UNKNOWN when its lease ends.
RELEASE_UNTAKEN_AFTER_FRACTION_OF_LEASE = 0.5


def _release_if_not_taken(ledger: LedgerClient | AsyncLedgerClient,
                          claimed: ClaimResult) -> None:
    lease = granted_lease(claimed) or 60.0
    loop = asyncio.get_running_loop()

    async def release() -> None:
        if not withdraw_handed_off(claimed):
            return  # the tool call took it
        try:
            await _call(ledger, "complete", claimed.key, claimed.claim_token, Status.FAILED,
                        error="claimed by needs_approval; the SDK never called the tool",
                        retryable=True)
        except LedgerError as e:
            log.warning("could not give back the untaken claim of %s: %s", claimed.key, e)

    def start() -> None:
        task = loop.create_task(release())
        _RELEASES.add(task)
        task.add_done_callback(_RELEASES.discard)

    loop.call_later(lease * RELEASE_UNTAKEN_AFTER_FRACTION_OF_LEASE, start)


_RELEASES: set[asyncio.Task[None]] = set()


def _run_id_of_state(state: RunState[Any, Any], run_id: str | None) -> str:
    if run_id:
        return run_id
    context = getattr(state, "_context", None)
    found = run_id_of_context(context) if isinstance(context, RunContextWrapper) else None
    if not found:
        raise ValueError("the run state's context names no run_id: pass run_id=")
    return found


async def awaiting_entry(ledger: LedgerClient | AsyncLedgerClient, state: RunState[Any, Any],
                         interruption: ToolApprovalItem, *, run_id: str | None = None,
                         canonicalization: str = "JCS") -> Entry:
    """The ledger's entry of an interruption (the call a person is asked about): show the
    person its ``tool`` and ``arguments_json`` (as the ledger stores them), and hand its
    ``fingerprint`` to :func:`decide`. `run_id`: when the state's context names none."""
    arguments = json.loads(interruption.arguments or "{}")
    return await _call(ledger, "lookup", run_id=_run_id_of_state(state, run_id),  # type: ignore[no-any-return]
                       tool=str(interruption.tool_name or interruption.name),
                       arguments=_with_defaults_of(state, interruption, arguments),
                       canonicalization=canonicalization)


def _with_defaults_of(state: RunState[Any, Any], interruption: ToolApprovalItem,
                      arguments: dict[str, Any]) -> dict[str, Any]:
    agent = interruption.agent
    for tool in getattr(agent, "tools", None) or ():
        if isinstance(tool, FunctionTool) and tool.name == interruption.tool_name:
            return _with_defaults(tool, arguments)
    return arguments


async def decide(approver: LedgerClient | AsyncLedgerClient, state: RunState[Any, Any],
                 interruption: ToolApprovalItem, fingerprint: str, decision: Decision | str,
                 reason: str = "", *, run_id: str | None = None) -> Entry:
    """The app's approve (or deny) button: records the person's decision in the ledger with
    `approver` (a client with the person's approver token) about the entry whose `fingerprint`
    the person was shown (:func:`awaiting_entry`), then lets the call through the SDK's gate
    (``state.approve``): resume the run with ``Runner.run(agent, state)``. The tool's own claim
    then acts once (approved) or tells the model the person's reason (denied)."""
    entry = await awaiting_entry(approver, state, interruption, run_id=run_id)
    decided: Entry = await _call(approver, "decide", entry.key, fingerprint, decision, reason)
    state.approve(interruption)
    return decided
