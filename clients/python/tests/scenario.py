"""What every adapter's test shares: the scripted conversation and a world of fake side effects.

The scripted model calls ``issue_credit`` twice in one turn (in parallel), then once more with
the members reordered and the amount spelled ``2e2``; the ledger must let the credit happen once
and the model's transcript hold one result and two replay notes.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from idempotency_ledger import Confirmation, NotExecuted, UnknownAttempt, found, not_found

CREDIT = {"customer": "c-42", "amount": 200, "currency": "EUR"}
#: The same intent as the model might spell it the third time.
CREDIT_RESPELLED = '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}'
REPLAY_NOTE = ("This action was already performed in this run; returning the earlier result. "
               "No new action was taken.")
#: The ledger's note for an outcome nobody knows: what the model reads of its own call that
#: raised once it started, and of every repeat.
UNKNOWN_NOTE = ("An earlier attempt of this action may or may not have taken effect: its outcome "
                "is unknown and is being reconciled. Do not repeat it. No new action was taken.")
UNKNOWN_VIEW = {"status": "outcome_unknown", "note": UNKNOWN_NOTE}
#: What the model reads when the tool's confirm found that an unknown outcome did not happen.
NOT_PERFORMED_NOTE = ("This action did not take effect: its outcome was unknown, and a check "
                      "found that nothing happened. No action was taken; it may be called again.")
NOT_PERFORMED_VIEW = {"status": "not_executed", "note": NOT_PERFORMED_NOTE}


class Payments:
    """A fake payments API: credits issued, in order. `delay` keeps the first credit in flight
    long enough that a parallel call meets it there (it then waits for the result, by the
    ledger's wait, whatever the delay)."""

    def __init__(self, delay: float = 0.2) -> None:
        self.credits: list[dict[str, Any]] = []
        self.refusals = 0
        self.delay = delay
        #: What confirm was asked, in order.
        self.confirmed: list[UnknownAttempt] = []
        self._lock = threading.Lock()

    def issue_credit(self, customer: str, amount: int, currency: str, reference: str) -> dict:
        time.sleep(self.delay)
        with self._lock:
            credit = {"credit_id": f"cr-{len(self.credits) + 1:03d}", "customer": customer,
                      "amount": amount, "currency": currency, "reference": reference}
            self.credits.append(credit)
        return {"credit_id": credit["credit_id"], "amount": amount, "currency": currency}

    def find(self, reference: str) -> dict | None:
        """The paired read: the credit issued with this reference, as issue_credit returned it."""
        with self._lock:
            credit = next((c for c in self.credits if c["reference"] == reference), None)
        if credit is None:
            return None
        return {"credit_id": credit["credit_id"], "amount": credit["amount"],
                "currency": credit["currency"]}

    def confirm(self, attempt: UnknownAttempt) -> Confirmation:
        """issue_credit's confirm: found by the attempt's external_ref, or certainly not."""
        self.confirmed.append(attempt)
        credit = self.find(attempt.external_ref)
        return found(credit) if credit is not None else not_found(
            f"no credit with reference {attempt.external_ref}")

    def refuse_once(self) -> None:
        """The API's first answer is a 429: nothing was done."""
        with self._lock:
            self.refusals += 1
            first = self.refusals == 1
        if first:
            raise NotExecuted("429: rate limited, nothing was done")


def count_notes(outputs: list[Any]) -> tuple[int, int]:
    """(results, replay notes) among the tool outputs the model read, whatever their form."""
    texts = [o if isinstance(o, str) else json.dumps(o) if not hasattr(o, "__dict__") else str(o)
             for o in outputs]
    notes = sum(REPLAY_NOTE in t for t in texts)
    return len(texts) - notes, notes
