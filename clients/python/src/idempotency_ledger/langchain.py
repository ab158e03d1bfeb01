"""LangChain v1 agents: a middleware makes every tool call run once per run.
``pip install 'idempotency-ledger[langchain]'``.

One line per agent::

    agent = create_agent(model, tools=[issue_credit, send_reply], checkpointer=saver,
                         middleware=[LedgerMiddleware(ledger, run_id="thread",
                                                      confirm={"issue_credit": find_credit})])
    agent.invoke({"messages": [...]}, config={"configurable": {"thread_id": conversation}})

``LedgerMiddleware.wrap_tool_call`` / ``awrap_tool_call`` claim each tool call (the model's tool
name and arguments, as it sent them) before the tool runs, and answer the model with a
``ToolMessage``: the tool's own on a first run; on a repeat the stored content with the replay
note; for an attempt in progress, a permanent failure, an unknown outcome, or one ``confirm``
found did not happen, the note.

**The run id** is, by ``run_id=``:

- ``"run"`` (the default): the ``run_id`` of the invocation's config (``config={"run_id": ...}``,
  a ``UUID`` as LangChain types it, or a string; LangGraph Server sets one per run). A new
  invocation is a new intent, as a person asking again is; without a ``run_id`` in the config
  the tool call is refused before anything is claimed (``NoRunId``, logged at ERROR once per
  tool);
- ``"thread"``: the config's ``thread_id`` (``config={"configurable": {"thread_id": ...}}``):
  every call of the conversation with the same arguments is one intent, across invocations; use
  it when an invocation is resumed after an interrupt or a crash and must not act again;
- a callable taking the ``ToolCallRequest`` and returning the run id.

A ``@tool`` function taking LangChain's ``runtime: ToolRuntime`` may use ``@ledger.tool()``
instead (importing this module teaches it the ``ToolRuntime``), keyed by the same config
``run_id``.

**Exceptions.** An exception raised once the tool started, and an error ``ToolMessage`` from a
tool that handles its ``ToolException`` (``handle_tool_error=True``), leave the outcome UNKNOWN:
the model reads the ledger's unknown note as the tool's message, on that call and on every
repeat (with ``confirm``: the result found, or "nothing happened"). To say the tool did not act,
raise ``NotExecuted``, or the ``ToolException`` from one::

    raise ToolException("the payments API refused the request") from NotExecuted()

which is recorded FAILED and retryable (a handled one reaches the model as the tool's error
message, as without the ledger). So are arguments the tool's schema refuses (the tool node's
error message) and a LangGraph ``interrupt()`` (a human approval asked before acting: the resumed
tool runs from its start). Tools that return a ``Command`` cannot be replayed: leave them out with
``tools=``.

**Approvals.** A call the ledger holds for a person (the server's approval policy, or
``require_approval=True``) pauses the thread with LangGraph's ``interrupt()`` (the agent needs a
checkpointer), its value the entry's ``key``, ``fingerprint``, ``decide_by`` and note under
``"idempotency_ledger"``, and the tool call; the run's entries are extended meanwhile. Key the
calls by the thread (``run_id="thread"``), so that the resumed invocation is the same intent. The
app's approve button decides with the person's token, then resumes the thread, each pending
interrupt by its id (LangGraph refuses a plain ``Command(resume=...)`` while several are
pending, as when the model asked for two gated calls in one step)::

    paused = state["__interrupt__"]
    for interrupt in paused:
        meta = interrupt.value["idempotency_ledger"]
        approver.decide(meta["key"], meta["fingerprint"], "approve", "checked")
    agent.invoke(Command(resume={interrupt.id: True for interrupt in paused}), config)

The resumed tool node claims again, and only the ledger's answer counts, whatever the resume
value: approved, the tool acts once (a thread resumed twice replays the one result); denied,
the model reads ``{"status": "denied", "note": ...}`` with the person's reason; a resume without
a Decide reads ``{"status": "awaiting_approval", "note": ...}`` and nothing acts. An interrupt
left out of the resume stays pending: the thread pauses again on it alone.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, ToolException
from langgraph.errors import GraphInterrupt
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime
from langgraph.types import Command, interrupt
from pydantic import BaseModel

from ._failures import causes
from ._frameworks import approval_metadata
from .client import AsyncLedgerClient, LedgerClient
from .codec import to_jsonable
from .errors import BeforeActing, NotExecuted
from .model import CallOutcome, Kind, UnknownAttempt
from .tools import (
    FrameworkContext,
    LedgerTool,
    checked_confirms,
    keep_paused_run,
    keep_paused_run_sync,
    missing_run_id,
    model_view,
    register_context,
    require_confirm,
    run_options,
    run_tool_call,
    run_tool_call_sync,
)

__all__ = ["LedgerMiddleware", "run_id_of_context"]

#: A LangGraph interrupt pauses the tool before it acts; the resumed run calls it anew.
NOT_EXECUTED = (GraphInterrupt,)


def _config_run_id(config: Any) -> str | None:
    run_id = (config or {}).get("run_id")
    return str(run_id) if run_id else None


def run_id_of_context(value: ToolRuntime) -> str | None:
    """The run id of the invocation's config, as LangChain's tool runtime carries it."""
    info = value.execution_info
    run_id = info.run_id if info is not None else None
    return str(run_id) if run_id else _config_run_id(value.config)


def ask_a_person(request: Any, outcome: CallOutcome[Any]) -> Any:
    """LangGraph's approval step for a call the ledger holds for a person: ``interrupt()`` with
    the entry's key, fingerprint, ``decide_by`` and note (and the tool call), which pauses the
    thread; the thread resumed (``Command(resume=...)``) runs the tool node again, whose claim
    alone decides: approved, it acts; whatever the resume value says, an entry still awaiting a
    decision only reads the awaiting note."""
    payload = approval_metadata(outcome)
    call = getattr(request, "tool_call", None)
    if isinstance(call, Mapping):
        payload["tool_call"] = {"name": call.get("name"), "args": call.get("args"),
                                "id": call.get("id")}
    return interrupt(payload)


register_context(FrameworkContext(
    framework="langchain", context_type=ToolRuntime, run_id=run_id_of_context,
    not_executed=NOT_EXECUTED, on_awaiting=ask_a_person,
    run_id_hint=('invoke the agent with config={"run_id": ...} and pass the same run_id again '
                 'whenever you resume it (after an approval or a crash): a new run_id per '
                 'invocation makes the resumed call a new intent')))


class _ErrorMessage(Exception):  # noqa: N818 (carries a message, is not an error of ours)
    """The tool answered with an error ToolMessage."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(str(message.content))
        self.message = message


class _Handled:
    """A tool's ``handle_tool_error`` that remembers the exception it turned into a message
    (LangChain hands it no further), then answers as the tool's own setting would."""

    def __init__(self, flag: Any) -> None:
        self.flag = flag
        self.error: ToolException | None = None

    def __call__(self, error: ToolException) -> Any:
        self.error = error
        if callable(self.flag):
            return self.flag(error)
        if isinstance(self.flag, str):
            return self.flag
        return error.args[0] if error.args else "Tool execution error"


def _refuses_arguments(tool: BaseTool | None, arguments: Mapping[str, Any]) -> bool:
    """Whether the tool's schema refuses the model's arguments (the tool then never starts)."""
    schema = getattr(tool, "tool_call_schema", None) if tool is not None else None
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return False
    try:
        schema.model_validate(dict(arguments))
    except Exception:
        return True
    return False


# What a call without a run id is told to do. Never a fresh run_id per invocation: the
# invocation that resumes a paused thread would then be a new intent, which claims anew and never
# finds the approval a person gave (or acts again after a crash).
_RUN_ID_FIX = {
    False: ('Key the calls by the conversation: LedgerMiddleware(ledger, run_id="thread"), and '
            'invoke the agent with config={"configurable": {"thread_id": ...}}, the same '
            'thread_id when you resume it (after an approval, an interrupt or a crash), so that '
            'the resumed call is the same intent. Or put a run_id in the config and pass the '
            'same one again on every resume'),
    True: ('Invoke the agent with config={"configurable": {"thread_id": ...}}, the same '
           'thread_id when you resume it'),
}


def _as_is(outcome: CallOutcome[Any]) -> CallOutcome[Any]:
    return outcome


class LedgerMiddleware(AgentMiddleware[Any, Any]):
    """Makes the agent's tool calls run once per intent (every tool, or those named in `tools`).

    Args:
        ledger: a :class:`~idempotency_ledger.Ledger` (sync and async agents) or an
            :class:`~idempotency_ledger.AsyncLedger` (``ainvoke`` only, in its event loop).
        tools: the names of the tools to make run-once; ``None``: all of them.
        confirm: each tool's paired read, by tool name (see ``ledger.tool(confirm=...)``). In
            strict mode (``require_confirm=True``) every tool named in `tools` needs one; with
            ``tools=None``, a tool without one is refused at its first call.
        run_id: ``"run"``, ``"thread"`` or a callable; see the module's documentation.
        interrupt: a call the ledger holds for a person pauses the thread with LangGraph's
            ``interrupt()`` (the default; the agent needs a checkpointer); False: the model
            reads the awaiting note instead.
        pause_retention: when it pauses a thread, every finished entry of the run is kept at
            least this many seconds from then (``extend_run``; default: the server's
            retention), so that the retries after a late resume still replay.
        options: the ``run_once`` options (``wait``, ``lease``, ``action_timeout``,
            ``confirm_delay``, ...).
    """

    def __init__(self, ledger: LedgerClient | AsyncLedgerClient, *,
                 tools: Collection[str] | None = None,
                 confirm: Mapping[str, Callable[[UnknownAttempt], Any]] | None = None,
                 run_id: str | Callable[[ToolCallRequest], Any] = "run",
                 interrupt: bool = True, pause_retention: float | None = None,
                 **options: Any) -> None:
        super().__init__()
        if run_id not in ("run", "thread") and not callable(run_id):
            raise ValueError(f"run_id must be 'run', 'thread' or a callable, not {run_id!r}")
        self.ledger = ledger
        # Not `self.tools`: that is AgentMiddleware's list of tools a middleware adds.
        self.tool_names = None if tools is None else frozenset(tools)
        self.confirm = checked_confirms(confirm)
        self.run_id = run_id
        self.interrupt = interrupt
        self.pause_retention = pause_retention
        self.options = run_options(**options)
        for name in self.tool_names or ():
            require_confirm(ledger, name, self.confirm.get(name))

    @property
    def ledger_tools(self) -> list[LedgerTool]:
        """The tools with a paired read, for the :class:`~idempotency_ledger.Reconciler`."""
        return [LedgerTool(name, confirm, self.options["codec"])
                for name, confirm in self.confirm.items()]

    def _applies(self, request: ToolCallRequest) -> bool:
        name = request.tool_call["name"]
        if self.tool_names is not None and name not in self.tool_names:
            return False
        require_confirm(self.ledger, name, self.confirm.get(name))
        return True

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
            raise missing_run_id(request.tool_call["name"], _RUN_ID_FIX[self.run_id == "thread"])
        return str(run_id)

    def _request(self, request: ToolCallRequest, handled: _Handled) -> ToolCallRequest:
        """The request with a copy of its tool that remembers a ToolException it handles."""
        tool = request.tool
        if tool is None or not tool.handle_tool_error:
            return request
        handled.flag = tool.handle_tool_error
        return request.override(tool=tool.model_copy(update={"handle_tool_error": handled}))

    def _stored(self, request: ToolCallRequest, message: ToolMessage | Command[Any],
                handled: _Handled) -> Any:
        """The content the ledger stores for the tool's message, or why it is not a result."""
        if isinstance(message, Command):
            raise TypeError("the tool returned a Command, which the ledger cannot replay: "
                            "leave the tool out with LedgerMiddleware(tools=...)")
        if message.status != "error":
            return message.content
        error = _ErrorMessage(message)
        said = handled.error
        if said is not None:
            error.__cause__ = said
        if _refuses_arguments(request.tool, request.tool_call["args"]) or (
                said is not None and any(isinstance(e, NotExecuted) for e in causes(said))):
            raise BeforeActing(error)  # it never started, or it says it did not act
        raise error  # it may have acted: UNKNOWN

    def _present(self, request: ToolCallRequest,
                 produced: list[ToolMessage]) -> Callable[[CallOutcome[Any]], ToolMessage]:
        call = request.tool_call

        def present(outcome: CallOutcome[Any]) -> ToolMessage:
            if outcome.kind == Kind.PERFORMED and produced:
                return produced[0]  # the tool's own message, as without the ledger
            view = model_view(outcome)  # raises what the framework must see
            if outcome.kind in (Kind.PERFORMED, Kind.CONFIRMED):
                content = view if isinstance(view, (str, list)) else json.dumps(
                    view, ensure_ascii=False)
                return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"])
            if outcome.kind == Kind.REPLAYED and isinstance(outcome.value, str):
                # The tool node stored JSON text: replay it as JSON, not as a quoted string.
                try:
                    view["result"] = json.loads(outcome.value)
                except ValueError:
                    pass
            failed = outcome.kind == Kind.PREVIOUSLY_FAILED
            return ToolMessage(content=json.dumps(view, ensure_ascii=False),
                               tool_call_id=call["id"], name=call["name"],
                               status="error" if failed else "success")

        return present

    def wrap_tool_call(self, request: ToolCallRequest,
                       handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
                       ) -> ToolMessage | Command[Any]:
        """Claims the call, runs the tool through `handler` if the claim is won."""
        if not self._applies(request):
            return handler(request)
        produced: list[ToolMessage] = []
        handled = _Handled(None)

        def act() -> Any:
            message = handler(self._request(request, handled))
            if isinstance(message, ToolMessage):
                produced.append(message)
            return self._stored(request, message, handled)

        name = request.tool_call["name"]
        run_id = self._run_id(request)
        try:
            outcome = run_tool_call_sync(
                self.ledger, run_id=run_id, tool=name,  # type: ignore[arg-type]
                arguments=to_jsonable(request.tool_call["args"]), act=act,
                options=self.options, not_executed=NOT_EXECUTED,
                confirm=self.confirm.get(name), present=_as_is)
            if outcome.kind == Kind.AWAITING_APPROVAL and self.interrupt:
                keep_paused_run_sync(self.ledger, run_id,  # type: ignore[arg-type]
                                     self.pause_retention)
                ask_a_person(request, outcome)  # pauses the thread; resumed: the note
            return self._present(request, produced)(outcome)
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
        handled = _Handled(None)

        async def act() -> Any:
            message = await handler(self._request(request, handled))
            if isinstance(message, ToolMessage):
                produced.append(message)
            return self._stored(request, message, handled)

        name = request.tool_call["name"]
        run_id = self._run_id(request)
        try:
            outcome = await run_tool_call(
                self.ledger, run_id=run_id, tool=name,
                arguments=to_jsonable(request.tool_call["args"]), act=act,
                options=self.options, not_executed=NOT_EXECUTED,
                confirm=self.confirm.get(name), present=_as_is)
            if outcome.kind == Kind.AWAITING_APPROVAL and self.interrupt:
                await keep_paused_run(self.ledger, run_id, self.pause_retention)
                ask_a_person(request, outcome)
            result: ToolMessage = self._present(request, produced)(outcome)
        except _ErrorMessage as refused:
            return refused.message
        return result
