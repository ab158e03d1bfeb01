"""MCP servers (FastMCP): a middleware makes the server's tools run once per run, by
configuration. ``pip install 'idempotency-ledger[mcp]'``.

One line per server::

    mcp = FastMCP("payments", middleware=[LedgerMiddleware(ledger)])

Every ``tools/call`` (of every tool, or of those named in ``tools=``; tools annotated
``readOnlyHint`` are left alone unless named) is claimed before the tool runs, keyed by the run
id **the client sends in the request's** ``_meta`` under ``"idempotency-ledger/run_id"``
(:data:`RUN_ID_META_KEY`), the tool's name and its arguments::

    await client.call_tool("issue_credit", args, meta={"idempotency-ledger/run_id": run_id})

A call without it gets a tool error that says so, and nothing runs: a run-once tool cannot know
which repeats are one intent without the client's run. The MCP client (the agent runtime) chooses
the run id as for any other framework: one per agent run, kept when the run is retried.

What the client reads: the tool's own result on a first run; on a repeat the stored result
(content and structured content, as stored) after a first text block with the replay note,
``{"status": "already_done", "note": ...}``, and ``_meta`` ``"idempotency-ledger/replayed":
true``; for an attempt in progress or an unknown outcome a text block with the note; for a
permanent failure recorded earlier, an error result with the note. (MCP requires every successful
result of a tool with an output schema to carry structured content matching it, which a note
cannot: for such tools, and FastMCP gives one to every tool with a return annotation, the notes
of in-progress and unknown outcomes are error results too. Their text says not to repeat the
call.) A tool's exception is re-raised (FastMCP makes it an error result) after it was recorded:
``NotExecuted`` as retryable, ``PermanentFailure`` as permanent, anything else as UNKNOWN. A tool
whose own result is an error result is recorded retryable.

A tool function that takes FastMCP's ``Context`` may use ``@ledger.tool()`` instead; the wrapper
reads the same ``_meta`` key.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import mcp_types as mt
from fastmcp import Context
from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from pydantic import TypeAdapter

from .client import BeforeActing
from .codec import to_jsonable
from .errors import PreviouslyFailedError
from .model import Result
from .tools import run_options, run_tool_call

if TYPE_CHECKING:
    from .client import AsyncLedger, Ledger

__all__ = ["REPLAYED_META_KEY", "RUN_ID_META_KEY", "LedgerMiddleware", "is_not_executed",
           "run_id_of_context"]

#: The ``_meta`` key of a ``tools/call`` request that carries the agent run's id.
RUN_ID_META_KEY = "idempotency-ledger/run_id"
#: The ``_meta`` key set (to true) on a result that was replayed, not produced anew.
REPLAYED_META_KEY = "idempotency-ledger/replayed"


def _request_meta(context: Context | None) -> Mapping[str, Any]:
    try:
        meta = context.request_context.meta if context is not None else None
    except Exception:  # no request in flight (a tool called outside a request)
        return {}
    return meta if isinstance(meta, Mapping) else {}


def run_id_of_context(value: Any) -> tuple[bool, str | None]:
    """(is it FastMCP's Context, the run id the client sent in the request's ``_meta``)."""
    if isinstance(value, Context):
        run_id = _request_meta(value).get(RUN_ID_META_KEY)
        return True, str(run_id) if run_id else None
    return False, None


def is_not_executed(error: BaseException) -> bool:
    """FastMCP has no exception of its own that says a tool did not act."""
    return False


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


class LedgerMiddleware(Middleware):
    """Makes the server's tool calls run once per intent; see the module's documentation.

    Args:
        ledger: a :class:`~idempotency_ledger.Ledger` or an :class:`~idempotency_ledger.AsyncLedger`
            (created in the server's event loop).
        tools: the names of the tools to make run-once; ``None``: every tool not annotated
            read-only.
        meta_key: the ``_meta`` key of the run id (default :data:`RUN_ID_META_KEY`).
        options: the ``run_once`` options (``wait``, ``lease``, ``action_timeout``, ...).
    """

    def __init__(self, ledger: Ledger | AsyncLedger, *, tools: Collection[str] | None = None,
                 meta_key: str = RUN_ID_META_KEY, **options: Any) -> None:
        self.ledger = ledger
        self.tool_names = None if tools is None else frozenset(tools)
        self.meta_key = meta_key
        self.options = run_options(**options)

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

    async def on_call_tool(
        self,
        context: MiddlewareContext[mt.CallToolRequestParams],
        call_next: CallNext[mt.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        """Claims the call, runs the tool through `call_next` if the claim is won."""
        if not await self._applies(context):
            return await call_next(context)
        name = context.message.name
        run_id = _request_meta(context.fastmcp_context).get(self.meta_key)
        if not run_id:
            raise ToolError(
                f"{name} runs once per agent run: send the run's id in the request's _meta, "
                f'{{"{self.meta_key}": "<run id>"}}. Nothing was done.')
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

        def present(outcome: Any) -> ToolResult:
            if isinstance(outcome, Result) and not outcome.replayed:
                return produced[0]
            view = outcome.for_model()
            if isinstance(outcome, Result):
                stored = outcome.value
                return ToolResult(
                    content=[_note({"status": view["status"], "note": view["note"]}),
                             *_BLOCKS.validate_python(stored["content"])],
                    structured_content=stored["structured_content"],
                    meta={**(stored["meta"] or {}), REPLAYED_META_KEY: True})
            return ToolResult(content=[_note(view)],
                              is_error=typed or isinstance(outcome, PreviouslyFailedError))

        try:
            result: ToolResult = await run_tool_call(
                self.ledger, run_id=str(run_id), tool=name,
                arguments=to_jsonable(context.message.arguments or {}), act=act,
                options=self.options, present=present)
        except _ErrorResult as refused:
            return refused.result
        return result
