#!/usr/bin/env python3
"""A pydantic-ai support agent whose write tools happen once per run, through the ledger.

Offline, no model key needed: the model is pydantic-ai's own ``FunctionModel`` playing a model
that calls ``issue_credit`` twice at once, then again with the arguments reordered and the
amount spelled ``2e2``, then replies to the ticket. The world is the examples' fake payments API
and mailbox (world.py). The one line per tool is ``@ledger.tool()``, under the agent's own
decorator.

    python pydantic_ai_agent.py --target 127.0.0.1:50051 --world world.json --run-id run-7f3a

prints what the model read from each tool call, one JSON line each. Run it again with the same
run id and nothing new happens; with another, the credit is issued again.
"""

from __future__ import annotations

import argparse
import json
import sys

from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from reads import confirm_credit, confirm_reply
from world import World

import idempotency_ledger.pydantic_ai  # noqa: F401 (teaches ledger.tool() the RunContext)
from idempotency_ledger import Ledger, current_attempt


def model_script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """What the offline model says at each turn of the conversation."""
    turn = sum(1 for m in messages if isinstance(m, ModelResponse))
    credit = {"customer": "c-42", "amount": 200, "currency": "EUR"}
    if turn == 0:  # a model that calls the same tool twice in one response
        return ModelResponse(parts=[ToolCallPart("issue_credit", credit),
                                    ToolCallPart("issue_credit", credit)])
    if turn == 1:  # and once more, spelled differently: the same intent
        return ModelResponse(parts=[ToolCallPart(
            "issue_credit", '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}')])
    if turn == 2:
        return ModelResponse(parts=[ToolCallPart(
            "send_reply", {"ticket": "t-9", "text": "Your credit of 200 EUR is on its way."})])
    return ModelResponse(parts=[TextPart("The credit is issued and the customer told.")])


def build_agent(ledger: Ledger, world: World) -> Agent[None, str]:
    """The agent, with its two write tools made run-once."""
    agent = Agent(FunctionModel(model_script), instructions="You are a support agent.")

    @agent.tool
    @ledger.tool(confirm=confirm_credit(world))   # its paired read settles an unknown outcome
    def issue_credit(ctx: RunContext[None], customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer's account."""
        credit = world.issue_credit(customer, amount, currency,
                                    reference=current_attempt().external_ref)
        return {"credit_id": credit["credit_id"], "amount": amount, "currency": currency}

    @agent.tool
    @ledger.tool(confirm=confirm_reply(world))
    def send_reply(ctx: RunContext[None], ticket: str, text: str) -> dict:
        """Reply to the customer on a support ticket."""
        reply = world.send_reply(ticket, text, reference=current_attempt().external_ref)
        return {"message_id": reply["message_id"]}

    return agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's address")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--run-id", required=True, help="the agent run (pydantic-ai's run_id)")
    ns = parser.parse_args(argv)
    with Ledger(ns.target) as ledger:
        agent = build_agent(ledger, World(ns.world))
        result = agent.run_sync("Please credit c-42 200 EUR and tell them.", run_id=ns.run_id)
    for message in result.all_messages():
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                print(json.dumps({"tool": part.tool_name, "read": part.content}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
