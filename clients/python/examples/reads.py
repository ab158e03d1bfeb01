"""The example tools' paired reads: for an attempt whose outcome nobody knows, each looks the
effect up in the world by the reference the tool passed to it (``external_ref``) and says what it
found. Registered with each tool (``confirm=``) and given to the reconciler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from world import World

from idempotency_ledger import Confirmation, UnknownAttempt, found, not_found


def credit_result(credit: dict[str, Any]) -> dict[str, Any]:
    """What issue_credit returns to the model, from the payments API's record."""
    return {"credit_id": credit["credit_id"], "amount": credit["amount"],
            "currency": credit["currency"]}


def reply_result(reply: dict[str, Any]) -> dict[str, Any]:
    """What send_reply returns to the model, from the mailbox's record."""
    return {"message_id": reply["message_id"]}


def confirm_credit(world: World) -> Callable[[UnknownAttempt], Confirmation]:
    def confirm(attempt: UnknownAttempt) -> Confirmation:
        credit = world.find_credit(attempt.external_ref)
        return found(credit_result(credit)) if credit else not_found(
            f"no credit with reference {attempt.external_ref}")

    return confirm


def confirm_reply(world: World) -> Callable[[UnknownAttempt], Confirmation]:
    def confirm(attempt: UnknownAttempt) -> Confirmation:
        reply = world.find_reply(attempt.external_ref)
        return found(reply_result(reply)) if reply else not_found(
            f"no reply with reference {attempt.external_ref}")

    return confirm


def paired_reads(world: World) -> dict[str, Callable[[UnknownAttempt], Confirmation]]:
    """Every tool's paired read, by tool name."""
    return {"issue_credit": confirm_credit(world), "send_reply": confirm_reply(world)}
