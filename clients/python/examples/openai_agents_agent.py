#!/usr/bin/env python3
"""An OpenAI Agents SDK support agent whose write tools happen once per run, through the ledger.

Offline, no model key needed: the model is the SDK's own ``ScriptedModel`` (an implementation of
its ``Model`` interface) playing a model that calls ``issue_credit`` twice at once, then again
with the arguments reordered and the amount spelled ``2e2``, then replies to the ticket. The
world is the examples' fake payments API and mailbox (world.py). The one line per tool is
``@ledger.tool()``, under ``@function_tool``; the run id is the ``run_id`` of the context passed
to ``Runner.run``.

    python openai_agents_agent.py --target 127.0.0.1:50051 --world world.json --run-id run-7f3a

prints what the model read from each tool call, one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from agents import Agent, Runner, function_tool, set_trace_processors
from agents.testing import ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from reads import confirm_credit, confirm_reply
from world import World

import idempotency_ledger.openai_agents  # noqa: F401 (teaches ledger.tool() the SDK's context)
from idempotency_ledger import Ledger, current_attempt


@dataclass
class Session:
    """What the runtime passes as the run's context: the ledger keys tool calls by its run_id."""

    run_id: str
    world: World


def offline_model() -> ScriptedModel:
    credit = {"customer": "c-42", "amount": 200, "currency": "EUR"}
    return ScriptedModel([
        [function_call("issue_credit", credit, call_id="call-1"),
         function_call("issue_credit", credit, call_id="call-2")],
        [function_call("issue_credit", '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}',
                       call_id="call-3")],
        [function_call("send_reply", {"ticket": "t-9",
                                      "text": "Your credit of 200 EUR is on its way."},
                       call_id="call-4")],
        [assistant_message("The credit is issued and the customer told.")],
    ])


def build_agent(ledger: Ledger, world: World) -> Agent[Session]:
    """The agent, with its two write tools made run-once."""

    @function_tool
    @ledger.tool(confirm=confirm_credit(world))   # its paired read settles an unknown outcome
    def issue_credit(ctx: ToolContext[Session], customer: str, amount: int,
                     currency: str) -> dict:
        """Issue a credit to a customer's account."""
        credit = ctx.context.world.issue_credit(customer, amount, currency,
                                                reference=current_attempt().external_ref)
        return {"credit_id": credit["credit_id"], "amount": amount, "currency": currency}

    @function_tool
    @ledger.tool(confirm=confirm_reply(world))
    def send_reply(ctx: ToolContext[Session], ticket: str, text: str) -> dict:
        """Reply to the customer on a support ticket."""
        reply = ctx.context.world.send_reply(ticket, text,
                                             reference=current_attempt().external_ref)
        return {"message_id": reply["message_id"]}

    return Agent(name="support", instructions="You are a support agent.",
                 model=offline_model(), tools=[issue_credit, send_reply])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's address")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--run-id", required=True, help="the agent run")
    ns = parser.parse_args(argv)
    set_trace_processors([])  # offline: the traces are not exported
    with Ledger(ns.target) as ledger:
        world = World(ns.world)
        result = Runner.run_sync(build_agent(ledger, world), "Please credit c-42 200 EUR.",
                                 context=Session(ns.run_id, world))
    names = {item["call_id"]: item["name"] for item in result.to_input_list()
             if item.get("type") == "function_call"}
    for item in result.to_input_list():
        if item.get("type") == "function_call_output":
            # The SDK hands the model str(value); print the text it read.
            print(json.dumps({"tool": names[item["call_id"]], "read": item["output"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
