#!/usr/bin/env python3
"""A person in the loop, in each framework: a refund over 100 waits for a person's approval.

The ledger server gates the refunds by its approval policy (``* issue_refund /amount > 100``);
the agent's token may not decide, the approver's token (the tokens file's third column,
``approver``) may. For each framework (OpenAI Agents SDK, pydantic-ai, LangChain v1 / LangGraph,
MCP) the agent asks for a refund of 250, the framework's own approval step stops the run, the
app's approve button calls ``decide`` with the person's token and resumes the run, and the refund
happens once. Offline: each framework's own test model plays the model.

    python approvals.py --target 127.0.0.1:50051 --agent-token tok-agent \
        --approver-token tok-dana --run-id run-7f3a

prints what the model read from the refund in each framework, one JSON line each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from agents import Agent as OpenAIAgent
from agents import Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from fastmcp import Client, FastMCP
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from idempotency_ledger import AsyncLedger, Ledger, current_attempt
from idempotency_ledger.langchain import LedgerMiddleware
from idempotency_ledger.mcp import RUN_ID_META_KEY, LedgerMiddleware as McpLedgerMiddleware
from idempotency_ledger.openai_agents import awaiting_entry, decide, gated

REFUND = {"order": "o-1001", "amount": 250}


class Payments:
    """The payments API: each refund issued, with the reference the ledger gave the attempt."""

    def __init__(self) -> None:
        self.refunds: list[dict[str, Any]] = []

    def refund(self, order: str, amount: int, reference: str) -> dict[str, Any]:
        self.refunds.append({"order": order, "amount": amount, "reference": reference})
        return {"refund_id": f"rf-{len(self.refunds):03d}", "order": order, "amount": amount}


# --- OpenAI Agents SDK: needs_approval asks the ledger; RunState.approve after decide ---------


async def openai_agents(target: str, agent_token: str, approver_token: str, run_id: str,
                        payments: Payments) -> Any:
    model = ScriptedModel([[function_call("issue_refund", REFUND, call_id="call-1")],
                           [assistant_message("Refunded.")]])
    async with AsyncLedger(target, token=agent_token) as ledger, \
            AsyncLedger(target, token=approver_token) as approver:
        # The tool: the ledger's, and gated() so that the SDK asks the ledger for approval.
        @function_tool
        @ledger.tool()
        async def issue_refund(ctx: ToolContext[Any], order: str, amount: int) -> dict:
            """Refund an order."""
            return payments.refund(order, amount, current_attempt().external_ref)

        agent = OpenAIAgent(name="support", model=model, tools=[gated(issue_refund, ledger)])
        result = await Runner.run(agent, "refund o-1001", context={"run_id": run_id})
        state = result.to_state()
        for interruption in result.interruptions:
            # The approve button: show the person the call, decide with their token, resume.
            entry = await awaiting_entry(approver, state, interruption)
            await decide(approver, state, interruption, entry.fingerprint, "approve",
                         "checked the order")
        result = await Runner.run(agent, state)
        return [item["output"] for item in result.to_input_list()
                if item.get("type") == "function_call_output"][-1]


# --- pydantic-ai: ApprovalRequired from the ledger, DeferredToolResults after decide ----------


def pydantic_ai(target: str, agent_token: str, approver_token: str, run_id: str,
                payments: Payments) -> Any:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("issue_refund", REFUND)])
        return ModelResponse(parts=[TextPart("Refunded.")])

    with Ledger(target, token=agent_token) as ledger, \
            Ledger(target, token=approver_token) as approver:
        agent = Agent(FunctionModel(respond), output_type=[str, DeferredToolRequests])

        # The tool: the ledger's under the agent's; a gated call ends the run for approval.
        @agent.tool
        @ledger.tool()
        def issue_refund(ctx: RunContext[None], order: str, amount: int) -> dict:
            """Refund an order."""
            return payments.refund(order, amount, current_attempt().external_ref)

        result = agent.run_sync("refund o-1001", run_id=run_id)
        if isinstance(result.output, DeferredToolRequests):
            # The approve button: decide with the person's token, resume with the approval.
            approvals = {}
            for call in result.output.approvals:
                meta = result.output.metadata[call.tool_call_id]["idempotency_ledger"]
                approver.decide(meta["key"], meta["fingerprint"], "approve", "checked the order")
                approvals[call.tool_call_id] = True
            result = agent.run_sync(message_history=result.all_messages(),
                                    deferred_tool_results=DeferredToolResults(approvals=approvals))
        return [part.content for m in result.new_messages() for part in m.parts
                if isinstance(part, ToolReturnPart)][-1]


# --- LangChain v1 / LangGraph: interrupt() from the middleware, Command(resume=...) -----------


def langchain(target: str, agent_token: str, approver_token: str, run_id: str,
              payments: Payments) -> Any:
    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Model:
            return self

    model = Model(responses=[
        AIMessage("", tool_calls=[{"name": "issue_refund", "args": REFUND, "id": "call-1"}]),
        AIMessage("Refunded.")])

    @tool
    def issue_refund(order: str, amount: int) -> dict:
        """Refund an order."""
        return payments.refund(order, amount, current_attempt().external_ref)

    with Ledger(target, token=agent_token) as ledger, \
            Ledger(target, token=approver_token) as approver:
        # The agent: the middleware keyed by the thread, and a checkpointer to pause it.
        agent = create_agent(model, tools=[issue_refund], checkpointer=InMemorySaver(),
                             middleware=[LedgerMiddleware(ledger, run_id="thread")])
        config = {"configurable": {"thread_id": run_id}}
        state = agent.invoke({"messages": [{"role": "user", "content": "refund o-1001"}]},
                             config)
        for paused in state.get("__interrupt__", []):
            # The approve button: decide with the person's token, resume the thread.
            meta = paused.value["idempotency_ledger"]
            approver.decide(meta["key"], meta["fingerprint"], "approve", "checked the order")
            state = agent.invoke(Command(resume=True), config)
        return json.loads([m.content for m in state["messages"]
                           if isinstance(m, ToolMessage)][-1])


# --- MCP: no approval step; the tool reads the awaiting note until a person decides ----------


async def mcp(target: str, agent_token: str, approver_token: str, run_id: str,
              payments: Payments) -> Any:
    async with AsyncLedger(target, token=agent_token) as ledger, \
            AsyncLedger(target, token=approver_token) as approver:
        server = FastMCP("refunds", middleware=[McpLedgerMiddleware(ledger)])

        @server.tool
        def issue_refund(order: str, amount: int) -> str:
            """Refund an order."""
            return json.dumps(payments.refund(order, amount, current_attempt().external_ref))

        async with Client(server) as client:
            meta = {RUN_ID_META_KEY: run_id}
            first = await client.call_tool_mcp("issue_refund", REFUND, meta=meta)
            waiting = json.loads(first.content[0].text)  # {"status": "awaiting_approval", ...}
            assert waiting["status"] == "awaiting_approval"
            # The approve button: the call as the ledger holds it, decided with the person's token.
            entry = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=REFUND)
            await approver.decide(entry.key, entry.fingerprint, "approve", "checked the order")
            again = await client.call_tool_mcp("issue_refund", REFUND, meta=meta)
            return json.loads(again.content[0].text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051",
                        help="The ledger server, which gates issue_refund over 100.")
    parser.add_argument("--agent-token", required=True, help="The agent's token.")
    parser.add_argument("--approver-token", required=True,
                        help="A person's token with the approver role.")
    parser.add_argument("--run-id", default=f"run-{uuid.uuid4().hex[:8]}",
                        help="The run id prefix; each framework's run adds its name.")
    args = parser.parse_args(argv)
    for name in ("openai_agents", "pydantic_ai", "langchain", "mcp"):
        payments = Payments()
        run = globals()[name]
        read = run(args.target, args.agent_token, args.approver_token,
                   f"{args.run_id}-{name}", payments)
        if asyncio.iscoroutine(read):
            read = asyncio.run(read)
        print(json.dumps({"framework": name, "refunds": len(payments.refunds),
                          "model_read": read}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
