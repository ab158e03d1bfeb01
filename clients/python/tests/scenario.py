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

from idempotency_ledger import NotExecuted

CREDIT = {"customer": "c-42", "amount": 200, "currency": "EUR"}
#: The same intent as the model might spell it the third time.
CREDIT_RESPELLED = '{"currency": "EUR", "amount": 2e2, "customer": "c-42"}'
REPLAY_NOTE = ("This action was already performed in this run; returning the earlier result. "
               "No new action was taken.")


class Payments:
    """A fake payments API: credits issued, in order. `delay` keeps the first credit in flight
    long enough that a parallel call meets it there (it then waits for the result, by the
    ledger's wait, whatever the delay)."""

    def __init__(self, delay: float = 0.2) -> None:
        self.credits: list[dict[str, Any]] = []
        self.refusals = 0
        self.delay = delay
        self._lock = threading.Lock()

    def issue_credit(self, customer: str, amount: int, currency: str, reference: str) -> dict:
        time.sleep(self.delay)
        with self._lock:
            credit = {"credit_id": f"cr-{len(self.credits) + 1:03d}", "customer": customer,
                      "amount": amount, "currency": currency, "reference": reference}
            self.credits.append(credit)
        return {"credit_id": credit["credit_id"], "amount": amount, "currency": currency}

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
