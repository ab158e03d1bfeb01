#!/usr/bin/env python3
"""A person in the loop, in each framework: refunds over 100 wait for a person's decision.

The ledger server gates the refunds by its approval policy (``* issue_refund /amount > 100``);
the agent's token may not decide, the approver's token (the tokens file's third column,
``approver``) may. For each framework (OpenAI Agents SDK, pydantic-ai, LangChain v1 / LangGraph,
MCP) the model asks for two refunds in one step, the framework's own approval step stops the run
on both, the person approves one and denies the other (the app's approve button calls
``decide`` with the person's token), and the run resumes once: the approved refund happens once,
and the model reads the person's reason for the other.

Offline, no model key needed: each framework's own test model plays the model (``ScriptedModel``,
``FunctionModel``, langchain_core's fake chat model; FastMCP's in-memory client plays the MCP
host).

    python approvals.py --target 127.0.0.1:50051 --agent-token tok-agent \
        --approver-token tok-dana --run-id run-7f3a

prints, one JSON line per framework, how many refunds happened and what the model read of each
call.

A decision made elsewhere (the console, ``idempotency-ledger approve|deny``) needs no Decide
here, and still needs the resume in the framework, as each function below says where it
resumes: the tool claims again and only the ledger's answer counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from agents import Agent as OpenAIAgent
from agents import Runner, function_tool, set_trace_processors
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

#: The two refunds the model asks for in one step, both over the policy's limit.
REFUNDS = [{"order": "o-1001", "amount": 250}, {"order": "o-1002", "amount": 300}]
#: Why the person declines the second.
DENIAL = "o-1002 was refunded by hand already"


def the_person(arguments: dict[str, Any]) -> tuple[str, str]:
    """What the person shown the call decides, with the reason the model reads on a denial."""
    if arguments["order"] == "o-1002":
        return "deny", DENIAL
    return "approve", "checked the order"


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
    set_trace_processors([])  # offline: the traces are not exported
    model = ScriptedModel([[function_call("issue_refund", args, call_id=f"call-{n}")
                            for n, args in enumerate(REFUNDS, 1)],
                           [assistant_message("One refunded, one declined.")]])
    async with AsyncLedger(target, token=agent_token) as ledger, \
            AsyncLedger(target, token=approver_token) as approver:
        # The tool: the ledger's, and gated() so that the SDK asks the ledger for approval.
        @function_tool
        @ledger.tool()
        async def issue_refund(ctx: ToolContext[Any], order: str, amount: int) -> dict:
            """Refund an order."""
            return payments.refund(order, amount, current_attempt().external_ref)

        agent = OpenAIAgent(name="support", model=model, tools=[gated(issue_refund, ledger)])
        result = await Runner.run(agent, "refund o-1001 and o-1002", context={"run_id": run_id})
        while result.interruptions:  # one per gated call of the step, however many
            state = result.to_state()
            for interruption in result.interruptions:
                # The approve button: show the person the call, decide with their token. decide()
                # approves the call in the RunState whatever the decision, so that a denied call
                # reads the person's reason. Decided elsewhere: state.approve(interruption) alone.
                entry = await awaiting_entry(approver, state, interruption)
                decision, reason = the_person(json.loads(entry.arguments_json))
                await decide(approver, state, interruption, entry.fingerprint, decision, reason)
            result = await Runner.run(agent, state)
        return [item["output"] for item in result.to_input_list()
                if item.get("type") == "function_call_output"]


# --- pydantic-ai: ApprovalRequired from the ledger, DeferredToolResults after decide ----------


def pydantic_ai(target: str, agent_token: str, approver_token: str, run_id: str,
                payments: Payments) -> Any:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("issue_refund", args) for args in REFUNDS])
        return ModelResponse(parts=[TextPart("One refunded, one declined.")])

    with Ledger(target, token=agent_token) as ledger, \
            Ledger(target, token=approver_token) as approver:
        agent = Agent(FunctionModel(respond), output_type=[str, DeferredToolRequests])

        # The tool: the ledger's under the agent's; a gated call ends the run for approval.
        @agent.tool
        @ledger.tool()
        def issue_refund(ctx: RunContext[None], order: str, amount: int) -> dict:
            """Refund an order."""
            return payments.refund(order, amount, current_attempt().external_ref)

        result = agent.run_sync("refund o-1001 and o-1002", run_id=run_id)
        while isinstance(result.output, DeferredToolRequests):  # every gated call of the step
            requests = result.output
            for call in requests.approvals:
                # The approve button: decide with the person's token (decided elsewhere: skip).
                meta = requests.metadata[call.tool_call_id]["idempotency_ledger"]
                decision, reason = the_person(call.args_as_dict())
                approver.decide(meta["key"], meta["fingerprint"], decision, reason)
            # True for every call, the denied one too: its claim hands the model the reason.
            answers = DeferredToolResults(
                approvals={call.tool_call_id: True for call in requests.approvals})
            result = agent.run_sync(message_history=result.all_messages(),
                                    deferred_tool_results=answers)
        return [part.content for m in result.all_messages() for part in m.parts
                if isinstance(part, ToolReturnPart)]


# --- LangChain v1 / LangGraph: interrupt() from the middleware, Command(resume=...) -----------


def langchain(target: str, agent_token: str, approver_token: str, run_id: str,
              payments: Payments) -> Any:
    class Model(FakeMessagesListChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Model:
            return self

    model = Model(responses=[
        AIMessage("", tool_calls=[{"name": "issue_refund", "args": args, "id": f"call-{n}"}
                                  for n, args in enumerate(REFUNDS, 1)]),
        AIMessage("One refunded, one declined.")])

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
        state = agent.invoke({"messages": [{"role": "user", "content": "refund both"}]},
                             config)
        while paused := state.get("__interrupt__"):  # one per gated call of the step
            for asked in paused:
                # The approve button: decide with the person's token (decided elsewhere: skip).
                meta = asked.value["idempotency_ledger"]
                decision, reason = the_person(asked.value["tool_call"]["args"])
                approver.decide(meta["key"], meta["fingerprint"], decision, reason)
            # Each interrupt resumed by its id, the denied one too (LangGraph refuses a plain
            # Command(resume=...) while several are pending); the value is never trusted.
            state = agent.invoke(Command(resume={asked.id: True for asked in paused}), config)
        return [json.loads(m.content) for m in state["messages"] if isinstance(m, ToolMessage)]


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
            reads = []
            for args in REFUNDS:
                first = await client.call_tool_mcp("issue_refund", args, meta=meta)
                waiting = json.loads(first.content[0].text)
                assert waiting["status"] == "awaiting_approval"
                # The approve button: the call as the ledger holds it, decided with the
                # person's token (decided elsewhere: skip); then the host calls again.
                entry = await ledger.lookup(run_id=run_id, tool="issue_refund", arguments=args)
                decision, reason = the_person(args)
                await approver.decide(entry.key, entry.fingerprint, decision, reason)
                again = await client.call_tool_mcp("issue_refund", args, meta=meta)
                reads.append(json.loads(again.content[0].text))
            return reads


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
