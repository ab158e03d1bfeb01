#!/usr/bin/env python3
"""An agent's tool dispatcher that makes its two write tools, ``issue_credit`` and
``send_reply``, happen once per intent through the ledger.

The model asks for a tool call; the dispatcher runs it through ``Ledger.run_once`` with the
agent run's id, and answers with the message the model sees: the result, and when it was
replayed the ledger's note, so the model knows nothing new happened.

    python dispatcher.py --target 127.0.0.1:50051 --world world.json --run-id run-7f3a \\
        issue_credit '{"customer":"c-42","amount":200,"currency":"EUR"}'

prints the message for the model as JSON. ``--fault`` simulates a failing API (see world.py).
No model is called, so no model key is needed: the command line plays the model's tool call.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from reads import credit_result, reply_result
from world import RateLimited, UnknownCustomer, World

from idempotency_ledger import (
    Attempt,
    InProgressError,
    Ledger,
    NotExecuted,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
)


class Dispatcher:
    """Runs the model's tool calls through the ledger. `fault` is passed to the world's API."""

    def __init__(self, ledger: Ledger, world: World, fault: str | None = None) -> None:
        self.ledger = ledger
        self.world = world
        self.fault = fault
        self.tools: dict[str, Callable[[Attempt, dict[str, Any]], Any]] = {
            "issue_credit": self._issue_credit,
            "send_reply": self._send_reply,
        }

    # The tools. Each passes the entry's external_ref to the API, so that the reconciler can
    # later ask whether the effect exists, and says how a failure should be recorded.

    def _issue_credit(self, attempt: Attempt, args: dict[str, Any]) -> dict[str, Any]:
        try:
            credit = self.world.issue_credit(args["customer"], args["amount"], args["currency"],
                                             reference=attempt.external_ref, fault=self.fault)
        except RateLimited as e:
            raise NotExecuted(str(e)) from e  # nothing happened: the intent may run again
        except UnknownCustomer as e:
            raise PermanentFailure(str(e)) from e  # will never happen in this intent
        return credit_result(credit)

    def _send_reply(self, attempt: Attempt, args: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = self.world.send_reply(args["ticket"], args["text"],
                                          reference=attempt.external_ref, fault=self.fault)
        except RateLimited as e:
            raise NotExecuted(str(e)) from e
        return reply_result(reply)

    def dispatch(self, run_id: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Runs one tool call of the model; returns the message the model sees."""
        if tool not in self.tools:
            return {"ok": False, "error": f"unknown tool {tool}"}
        try:
            result = self.ledger.run_once(run_id, tool, arguments,
                                          lambda attempt: self.tools[tool](attempt, arguments))
        except PreviouslyFailedError as e:
            return {"ok": False, "note": e.note}  # the note quotes the stored error
        except OutcomeUnknownError as e:
            return {"ok": False, "status": "unknown", "note": e.note}
        except InProgressError as e:
            return {"ok": False, "status": "in_progress", "note": e.note,
                    "retry_after": e.retry_after}
        except NotExecuted as e:
            return {"ok": False, "error": str(e), "retryable": True}
        except PermanentFailure as e:
            return {"ok": False, "error": str(e), "retryable": False}
        except TimeoutError as e:
            return {"ok": False, "status": "unknown",
                    "note": f"{e}. Whether it happened is not known yet; do not call it again."}
        message = {"ok": True, "result": result.value, "replayed": result.replayed}
        if result.replayed:
            message["note"] = result.note
        return message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--target", default="127.0.0.1:50051", help="the ledger's host:port")
    parser.add_argument("--token", help="bearer token of the tenant, if the ledger needs one")
    parser.add_argument("--world", required=True, help="the example world's JSON file")
    parser.add_argument("--run-id", required=True, help="the agent run")
    parser.add_argument("--fault", choices=("rate-limited", "timeout-before-effect",
                                            "timeout-after-effect"),
                        help="make the API fail this way (see world.py)")
    parser.add_argument("tool", help="issue_credit or send_reply")
    parser.add_argument("arguments", help="the tool call's arguments, a JSON object")
    ns = parser.parse_args(argv)
    with Ledger(ns.target, token=ns.token) as ledger:
        dispatcher = Dispatcher(ledger, World(ns.world), fault=ns.fault)
        message = dispatcher.dispatch(ns.run_id, ns.tool, json.loads(ns.arguments))
    print(json.dumps(message))
    return 0


if __name__ == "__main__":
    sys.exit(main())
