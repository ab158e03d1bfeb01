"""The outside world of the examples: a payments API and a support mailbox, kept in one JSON file
so that the dispatcher and the reconciler, separate processes, see the same effects.

Each write takes a `reference` (the ledger entry's ``external_ref``) and each has a paired read by
that reference, which is what a reconciler asks when the ledger does not know whether a write
happened. A real payments API would take the reference as its idempotency key or memo.

`fault` simulates what goes wrong with real APIs:

- ``rate-limited``: refused before acting (the effect certainly did not happen);
- ``timeout-before-effect``: the call times out and the request never arrived;
- ``timeout-after-effect``: the effect happened, then the answer was lost.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FAULTS = ("rate-limited", "timeout-before-effect", "timeout-after-effect")
KNOWN_CUSTOMERS = {"c-42", "c-43", "c-77"}


class RateLimited(Exception):
    """The API refused the request before acting."""


class UnknownCustomer(Exception):
    """No such customer: the credit will never be issued."""


class World:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.path.read_text()) if self.path.exists() else {}
            state.setdefault("credits", [])
            state.setdefault("replies", [])
            yield state
            self.path.write_text(json.dumps(state, indent=2))

    @staticmethod
    def _fault_before(fault: str | None) -> None:
        if fault == "rate-limited":
            raise RateLimited("429: too many requests, nothing was done")
        if fault == "timeout-before-effect":
            raise TimeoutError("no answer from the API within 5 s")

    # --- payments -----------------------------------------------------------------------------

    def issue_credit(self, customer: str, amount: int | float, currency: str, reference: str,
                     fault: str | None = None) -> dict[str, Any]:
        self._fault_before(fault)
        if customer not in KNOWN_CUSTOMERS:
            raise UnknownCustomer(f"customer {customer} does not exist")
        with self._state() as state:
            credit = {"credit_id": f"cr-{len(state['credits']) + 1:03d}", "customer": customer,
                      "amount": amount, "currency": currency, "reference": reference}
            state["credits"].append(credit)
        if fault == "timeout-after-effect":
            raise TimeoutError("no answer from the API within 5 s")
        return credit

    def find_credit(self, reference: str) -> dict[str, Any] | None:
        with self._state() as state:
            return next((c for c in state["credits"] if c["reference"] == reference), None)

    def credits(self) -> list[dict[str, Any]]:
        with self._state() as state:
            return list(state["credits"])

    # --- mailbox ------------------------------------------------------------------------------

    def send_reply(self, ticket: str, text: str, reference: str,
                   fault: str | None = None) -> dict[str, Any]:
        self._fault_before(fault)
        with self._state() as state:
            reply = {"message_id": f"msg-{len(state['replies']) + 1:03d}", "ticket": ticket,
                     "text": text, "reference": reference}
            state["replies"].append(reply)
        if fault == "timeout-after-effect":
            raise TimeoutError("no answer from the mail server within 5 s")
        return reply

    def find_reply(self, reference: str) -> dict[str, Any] | None:
        with self._state() as state:
            return next((r for r in state["replies"] if r["reference"] == reference), None)

    def replies(self) -> list[dict[str, Any]]:
        with self._state() as state:
            return list(state["replies"])
