#!/usr/bin/env python3
"""A LangChain v1 support agent whose tool calls happen once per run, through the ledger.

Offline, no model key needed: the model is langchain_core's fake chat model
(``FakeMessagesListChatModel``) playing a model that calls ``issue_credit`` twice at once, then
again with the arguments reordered and the amount spelled ``2e2``, then replies to the ticket.
The world is the examples' fake payments API and mailbox (world.py). The one line is
``middleware=[LedgerMiddleware(ledger)]``; the run id is the ``run_id`` of the invocation's
config.

    python langchain_agent.py --target 127.0.0.1:50051 --world world.json --run-id run-7f3a

prints what the model read from each tool call, one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from reads import paired_reads
from world import World

from idempotency_ledger import Ledger, current_attempt
from idempotency_ledger.langchain import LedgerMiddleware


class OfflineModel(FakeMessagesListChatModel):
    """langchain_core's fake chat model, answering from its script; it 'binds' tools by
    ignoring them, as a scripted model may."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> OfflineModel:
        return self


def offline_model() -> OfflineModel:
    credit = {"customer": "c-42", "amount": 200, "currency": "EUR"}
    respelled = json.loads('{"currency": "EUR", "amount": 2e2, "customer": "c-42"}')
    reply = {"ticket": "t-9", "text": "Your credit of 200 EUR is on its way."}
    return OfflineModel(responses=[
        AIMessage("", tool_calls=[{"name": "issue_credit", "args": credit, "id": "call-1"},
                                  {"name": "issue_credit", "args": credit, "id": "call-2"}]),
        AIMessage("", tool_calls=[{"name": "issue_credit", "args": respelled, "id": "call-3"}]),
        AIMessage("", tool_calls=[{"name": "send_reply", "args": reply, "id": "call-4"}]),
        AIMessage("The credit is issued and the customer told."),
    ])


def build_agent(ledger: Ledger, world: World) -> Any:
    """The agent; the middleware makes every tool call run once per run."""

    @tool
    def issue_credit(customer: str, amount: int, currency: str) -> dict:
        """Issue a credit to a customer's account."""
        credit = world.issue_credit(customer, amount, currency,
                                    reference=current_attempt().external_ref)
        return {"credit_id": credit["credit_id"], "amount": amount, "currency": currency}

    @tool
    def send_reply(ticket: str, text: str) -> dict:
        """Reply to the customer on a support ticket."""
        reply = world.send_reply(ticket, text, reference=current_attempt().external_ref)
        return {"message_id": reply["message_id"]}

    return create_agent(offline_model(), tools=[issue_credit, send_reply],
                        system_prompt="You are a support agent.",
                        # Each write tool with its paired read, which settles an unknown outcome.
                        middleware=[LedgerMiddleware(ledger, confirm=paired_reads(world))])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's address")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--run-id", required=True, help="the agent run (the config's run_id)")
    ns = parser.parse_args(argv)
    # LangChain wants the run_id of a config to be a UUID: derive one from the run's name.
    run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"agent-run:{ns.run_id}")
    with Ledger(ns.target) as ledger:
        state = build_agent(ledger, World(ns.world)).invoke(
            {"messages": [{"role": "user", "content": "Please credit c-42 200 EUR."}]},
            config={"run_id": run_id})
    for message in state["messages"]:
        if isinstance(message, ToolMessage):
            print(json.dumps({"tool": message.name, "read": message.content}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
