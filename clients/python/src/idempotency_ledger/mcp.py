"""MCP servers (FastMCP): a middleware makes the server's tools run once per run, by
configuration. ``pip install 'idempotency-ledger[mcp]'``.

One line per server::

    mcp = FastMCP("payments", middleware=[LedgerMiddleware(ledger)])

Every ``tools/call`` (of every tool, or of those named in ``tools=``; tools annotated
``readOnlyHint`` are left alone unless named) is claimed before the tool runs, keyed by the run
id **the client sends in the request's** ``_meta`` under ``"idempotency-ledger/run_id"``
(:data:`RUN_ID_META_KEY`), the tool's name and its arguments::

    await client.call_tool("issue_credit", args, meta={"idempotency-ledger/run_id": run_id})

A call without it gets a tool error that says so, and nothing runs (the server logs it at ERROR,
once per tool): a run-once tool cannot know which repeats are one intent without the client's
run. The MCP client (the agent runtime) chooses the run id as for any other framework: one per
agent run, kept when the run is retried. A host that cannot send ``_meta`` (most chat hosts do
not) gets its run id from the server instead: ``run_id=`` is a callable of the request's
``MiddlewareContext`` (its session, its arguments) returning the run id, such as the session's::

    LedgerMiddleware(ledger, run_id=lambda ctx: ctx.fastmcp_context.session_id)

What the client reads: the tool's own result on a first run; on a repeat the stored result
(content and structured content, as stored) after a first text block with the replay note,
``{"status": "already_done", "note": ...}``, and ``_meta`` ``"idempotency-ledger/replayed":
true``; for an attempt in progress, an unknown outcome (this call's own too) or one ``confirm``
found did not happen, a text block with the note; for a permanent failure recorded earlier, an
error result with the note. (MCP requires every successful
result of a tool with an output schema to carry structured content matching it, which a note
cannot: for such tools, and FastMCP gives one to every tool with a return annotation, the notes
of in-progress and unknown outcomes are error results too. Their text says not to repeat the
call.) An exception raised once the tool started (FastMCP's ``ToolError`` included) is recorded
UNKNOWN and the client reads the unknown note; with ``confirm={"issue_credit": find_credit}`` the
outcome is settled first (the result found, or "nothing happened"). ``NotExecuted``, or a
``ToolError`` raised from one (``raise ToolError("refused") from NotExecuted()``), is recorded
retryable, and ``PermanentFailure`` as permanent: both are re-raised (FastMCP makes them an error
result). A tool whose own result is an error result is recorded retryable.

A tool function that takes FastMCP's ``Context`` may use ``@ledger.tool()`` instead; the wrapper
reads the same ``_meta`` key.

**Approvals.** MCP has no approval step: a call the ledger holds for a person (the server's
approval policy, or ``require_approval=True``) answers a text block ``{"status":
"awaiting_approval", "note": ...}`` (nothing was done; the note gives the deadline), and a call
a person declined ``{"status": "denied", "note": ...}`` with the reason (error results for a
tool with an output schema, as the other notes). The app decides with the person's token
(``ledger.decide(key, fingerprint, "approve", reason)``); the client's next call of the same
arguments then acts, once.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

import mcp_types as mt
from fastmcp import Context
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from pydantic import TypeAdapter

from .client import AsyncLedgerClient, LedgerClient
from .codec import to_jsonable
from .errors import BeforeActing
from .model import Answer, CallOutcome, Confirmation, Kind, UnknownAttempt, found
from .tools import (
    FrameworkContext,
    LedgerTool,
    checked_confirms,
    missing_run_id,
    missing_run_id_view,
    model_view,
    register_context,
    require_confirm,
    run_options,
    run_tool_call,
)

__all__ = ["REPLAYED_META_KEY", "RUN_ID_META_KEY", "LedgerMiddleware", "run_id_of_context"]

#: The ``_meta`` key of a ``tools/call`` request that carries the agent run's id.
RUN_ID_META_KEY = "idempotency-ledger/run_id"
#: The ``_meta`` key set (to true) on a result that was replayed, not produced anew.
REPLAYED_META_KEY = "idempotency-ledger/replayed"


def _request_meta(context: Context | None) -> Mapping[str, Any]:
    try:
        meta = context.request_context.meta if context is not None else None
    except Exception:  # no request in flight (a tool called outside a request)
        return {}
    if meta is not None and not isinstance(meta, Mapping):
        meta = getattr(meta, "model_extra", None) or {}
    return meta if isinstance(meta, Mapping) else {}


def run_id_of_context(value: Context) -> str | None:
    """The run id the client sent in the request's ``_meta``, from FastMCP's Context."""
    run_id = _request_meta(value).get(RUN_ID_META_KEY)
    return str(run_id) if run_id else None


register_context(FrameworkContext(
    framework="fastmcp", context_type=Context, run_id=run_id_of_context,
    run_id_hint=f'have the client send _meta={{"{RUN_ID_META_KEY}": run_id}} with each call'))


class _ErrorResult(Exception):  # noqa: N818 (carries a result, is not an error of ours)
    def __init__(self, result: ToolResult) -> None:
        super().__init__("the tool returned an error result")
        self.result = result


def _stored(result: ToolResult) -> dict[str, Any]:
    """A tool's result as the ledger stores it: its MCP wire form."""
    if result.is_error:
        raise BeforeActing(_ErrorResult(result))
    return {
        "content": [block.model_dump(mode="json", by_alias=True, exclude_none=True)
                    for block in result.content],
        "structured_content": result.structured_content,
        "meta": result.meta,
    }


_BLOCKS = TypeAdapter(list[mt.ContentBlock])


def _note(view: Mapping[str, Any]) -> mt.TextContent:
    return mt.TextContent(type="text", text=json.dumps(view, ensure_ascii=False))


def _found_result(value: Any) -> ToolResult:
    """The result ``confirm`` found, as the tool would have answered: a stored MCP result as
    it is, anything else as its JSON text (structured when it is an object)."""
    if isinstance(value, Mapping) and "content" in value and "structured_content" in value:
        return ToolResult(content=_BLOCKS.validate_python(value["content"]),
                          structured_content=value["structured_content"], meta=value.get("meta"))
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return ToolResult(content=[mt.TextContent(type="text", text=text)],
                      structured_content=value if isinstance(value, dict) else None)


class LedgerMiddleware(Middleware):
    """Makes the server's tool calls run once per intent; see the module's documentation.

    Args:
        ledger: a :class:`~idempotency_ledger.Ledger` or an :class:`~idempotency_ledger.AsyncLedger`
            (created in the server's event loop).
        tools: the names of the tools to make run-once; ``None``: every tool not annotated
            read-only.
        confirm: each tool's paired read, by tool name (see ``ledger.tool(confirm=...)``). In
            strict mode (``require_confirm=True``) every tool named in `tools` needs one; with
            ``tools=None``, a tool without one is refused at its first call.
        run_id: a callable of the request's ``MiddlewareContext`` returning the run id, instead of
            the client's ``_meta``.
        meta_key: the ``_meta`` key of the run id (default :data:`RUN_ID_META_KEY`).
        options: the ``run_once`` options (``wait``, ``lease``, ``action_timeout``,
            ``confirm_delay``, ...).
    """

    def __init__(self, ledger: LedgerClient | AsyncLedgerClient, *,
                 tools: Collection[str] | None = None,
                 confirm: Mapping[str, Callable[[UnknownAttempt], Any]] | None = None,
                 run_id: Callable[[MiddlewareContext[mt.CallToolRequestParams]], Any]
                 | None = None,
                 meta_key: str = RUN_ID_META_KEY, **options: Any) -> None:
        if run_id is not None and not callable(run_id):
            raise TypeError(f"run_id must be a callable of the request's context, not {run_id!r}")
        self.ledger = ledger
        self.tool_names = None if tools is None else frozenset(tools)
        self.confirm = checked_confirms(confirm)
        self.run_id = run_id
        self.meta_key = meta_key
        self.options = run_options(**options)
        for name in self.tool_names or ():
            require_confirm(ledger, name, self.confirm.get(name))

    @property
    def ledger_tools(self) -> list[LedgerTool]:
        """The tools with a paired read, for the :class:`~idempotency_ledger.Reconciler` (what
        they find is stored in the MCP result's form, as the middleware stores a result)."""
        return [LedgerTool(name, self._confirm(name), self.options["codec"])
                for name in self.confirm]

    def _confirm(self, name: str) -> Callable[[UnknownAttempt], Any] | None:
        """The tool's confirm, its found result turned into the stored form of an MCP result,
        so that a repeat replays it as it replays a result the tool returned."""
        confirm = self.confirm.get(name)
        if confirm is None:
            return None

        async def as_stored(attempt: UnknownAttempt) -> Any:
            if inspect.iscoroutinefunction(confirm):
                answer = await confirm(attempt)
            else:  # a blocking read: in a thread, so the server's loop keeps serving
                answer = await asyncio.to_thread(confirm, attempt)
            if inspect.isawaitable(answer):
                answer = await answer
            if isinstance(answer, Confirmation) and answer.answer == Answer.FOUND:
                return found(_stored(_found_result(answer.result)))
            return answer

        return as_stored

    async def _applies(self, context: MiddlewareContext[mt.CallToolRequestParams]) -> bool:
        name = context.message.name
        if self.tool_names is not None:
            return name in self.tool_names
        server = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        if server is None:
            return True
        tool = await server.get_tool(name)
        annotations = getattr(tool, "annotations", None)
        return not (annotations is not None and annotations.read_only_hint)

    def _run_id(self, context: MiddlewareContext[mt.CallToolRequestParams]) -> str | None:
        if self.run_id is not None:
            run_id = self.run_id(context)
        else:
            run_id = _request_meta(context.fastmcp_context).get(self.meta_key)
        return str(run_id) if run_id else None

    async def on_call_tool(
        self,
        context: MiddlewareContext[mt.CallToolRequestParams],
        call_next: CallNext[mt.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        """Claims the call, runs the tool through `call_next` if the claim is won."""
        if not await self._applies(context):
            return await call_next(context)
        name = context.message.name
        try:
            require_confirm(self.ledger, name, self.confirm.get(name))
        except ValueError as e:
            raise ToolError(f"{e}. Nothing was done.") from e
        run_id = self._run_id(context)
        if not run_id:
            fix = ("the server's run_id= callable found none for this request" if self.run_id
                   else f'send the run\'s id in the request\'s _meta, {{"{self.meta_key}": '
                        '"<run id>"}, or give LedgerMiddleware a run_id= callable')
            error = missing_run_id(name, fix)
            # The host is who can send the run id: it reads how, after the note every client
            # gives (clients/parity.json, model_reads.missing_run_id).
            note = missing_run_id_view(name)["note"]
            raise ToolError(f"{note} To fix it: {fix}.") from error
        produced: list[ToolResult] = []

        async def act() -> dict[str, Any]:
            result = await call_next(context)
            produced.append(result)
            return _stored(result)

        server = context.fastmcp_context.fastmcp if context.fastmcp_context else None
        tool = await server.get_tool(name) if server is not None else None
        # MCP wants structured content matching a tool's output schema in every successful
        # result, and a note is not the tool's result: with a schema, notes are error results.
        typed = getattr(tool, "output_schema", None) is not None

        def present(outcome: CallOutcome[Any]) -> ToolResult:
            if outcome.kind == Kind.PERFORMED and produced:
                return produced[0]
            view = model_view(outcome)  # raises what the framework must see
            if outcome.kind in (Kind.PERFORMED, Kind.CONFIRMED):
                return _found_result(view)
            if outcome.kind == Kind.REPLAYED:
                stored = outcome.value
                return ToolResult(
                    content=[_note({"status": view["status"], "note": view["note"]}),
                             *_BLOCKS.validate_python(stored["content"])],
                    structured_content=stored["structured_content"],
                    meta={**(stored["meta"] or {}), REPLAYED_META_KEY: True})
            return ToolResult(content=[_note(view)],
                              is_error=typed or outcome.kind == Kind.PREVIOUSLY_FAILED)

        try:
            result: ToolResult = await run_tool_call(
                self.ledger, run_id=run_id, tool=name,
                arguments=to_jsonable(context.message.arguments or {}), act=act,
                options=self.options, confirm=self._confirm(name), present=present)
        except _ErrorResult as refused:
            return refused.result
        return result
