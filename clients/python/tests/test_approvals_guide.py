"""The loops of docs/approvals.md, run as written: each framework's Python block, with the
framework's real package and an offline model that asks for two gated refunds in one step,
against the real server with an approval policy. The person approves each call, the run resumes,
and each refund happens once. (The names a block leaves to the reader, ``ledger``, ``approver``,
``model``, ``payments``, ``run_id``, are given here; test_doc_blocks.py checks that they are
the only ones.)"""

from __future__ import annotations

import ast
import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

from agents import set_trace_processors
from agents.testing import ScriptedModel, assistant_message, function_call
from conftest import AGENT_TOKEN, APPROVER_TOKEN
from langchain_core.messages import AIMessage
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from test_langchain import ToolCallingFakeModel

from idempotency_ledger import AsyncLedger, Ledger
from idempotency_ledger.testing import LedgerServer

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "approvals.md"
#: Two refunds over the policy's 100, asked for in one model step.
TWO = [{"order": "o-1001", "amount": 250}, {"order": "o-1002", "amount": 300}]


def guide_block(section: str) -> Any:
    """The compiled ```python block of the guide's section `section`."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(f"\n### {section}\n")
    match = re.compile(r"^```python\n(.*?)^```", re.S | re.M).search(text, start)
    assert match is not None and text.find("\n### ", start + 1) > match.start(), section
    return compile(match[1], f"docs/approvals.md, {section}", "exec",
                   flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


class Payments:
    """The payments API the guide's tools call: each refund, with the attempt's reference."""

    def __init__(self) -> None:
        self.refunds: list[dict[str, Any]] = []

    def refund(self, order: str, amount: int, reference: str) -> dict[str, Any]:
        self.refunds.append({"order": order, "amount": amount, "reference": reference})
        return {"refund_id": f"rf-{len(self.refunds):03d}"}


def refunded_once_each(payments: Payments) -> None:
    assert sorted(r["order"] for r in payments.refunds) == ["o-1001", "o-1002"]
    assert len({r["reference"] for r in payments.refunds}) == 2


def test_the_openai_agents_loop_of_the_guide_acts_once_per_gated_call(
        approval_server: LedgerServer) -> None:
    set_trace_processors([])
    payments = Payments()
    model = ScriptedModel([[function_call("issue_refund", args, call_id=f"call-{n}")
                            for n, args in enumerate(TWO, 1)],
                           [assistant_message("Both refunded.")]])

    async def main() -> dict[str, Any]:
        async with AsyncLedger(approval_server.address, token=AGENT_TOKEN) as ledger, \
                AsyncLedger(approval_server.address, token=APPROVER_TOKEN) as approver:
            names = {"ledger": ledger, "approver": approver, "model": model,
                     "payments": payments, "run_id": f"run-{uuid.uuid4().hex[:8]}"}
            await eval(guide_block("OpenAI Agents SDK (Python)"), names)  # noqa: S307 (our guide)
            return names

    names = asyncio.run(main())
    assert names["result"].interruptions == [] and names["result"].final_output == "Both refunded."
    refunded_once_each(payments)


def test_the_pydantic_ai_loop_of_the_guide_acts_once_per_gated_call(
        approval_server: LedgerServer) -> None:
    payments = Payments()

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("issue_refund", args) for args in TWO])
        return ModelResponse(parts=[TextPart("Both refunded.")])

    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        names = {"ledger": ledger, "approver": approver, "model": FunctionModel(respond),
                 "payments": payments, "run_id": f"run-{uuid.uuid4().hex[:8]}"}
        exec(guide_block("pydantic-ai"), names)  # noqa: S102 (our guide)
    assert names["result"].output == "Both refunded."
    refunded_once_each(payments)


def test_the_langgraph_loop_of_the_guide_acts_once_per_gated_call(
        approval_server: LedgerServer) -> None:
    payments = Payments()
    model = ToolCallingFakeModel(responses=[
        AIMessage("", tool_calls=[{"name": "issue_refund", "args": args, "id": f"call-{n}"}
                                  for n, args in enumerate(TWO, 1)]),
        AIMessage("Both refunded.")])
    with Ledger(approval_server.address, token=AGENT_TOKEN) as ledger, \
            Ledger(approval_server.address, token=APPROVER_TOKEN) as approver:
        names = {"ledger": ledger, "approver": approver, "model": model, "payments": payments,
                 "run_id": f"thread-{uuid.uuid4().hex[:8]}"}
        exec(guide_block("LangChain v1 and LangGraph"), names)  # noqa: S102 (our guide)
    assert "__interrupt__" not in names["state"]
    assert names["state"]["messages"][-1].content == "Both refunded."
    refunded_once_each(payments)
