"""Credentials select the tenant; a tenant cannot see another's keys."""

from __future__ import annotations

import grpc
import pytest

from idempotency_ledger import Ledger, NotFound, Outcome, Status, Unauthenticated
from idempotency_ledger.testing import LedgerServer

ARGS = {"customer": "c-42", "amount": 200, "currency": "EUR"}


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_a_missing_or_wrong_token_is_unauthenticated(auth_server: LedgerServer,
                                                     token: str | None) -> None:
    with Ledger(auth_server.address, token=token) as ledger:
        with pytest.raises(Unauthenticated) as refused:
            ledger.claim("run-1", "t", {})
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.reason == "UNAUTHENTICATED"


def test_another_tenant_cannot_see_or_complete_a_key(auth_server: LedgerServer,
                                                     run_id: str) -> None:
    with Ledger(auth_server.address, token="token-a") as a, \
            Ledger(auth_server.address, token="token-b") as b:
        claim = a.claim(run_id, "issue_credit", ARGS)
        with pytest.raises(NotFound) as hidden:
            b.lookup(claim.key)
        assert hidden.value.reason == "ENTRY_NOT_FOUND"
        with pytest.raises(NotFound):
            b.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b"b")
        a.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b'"a"')
        with pytest.raises(NotFound):
            b.lookup(run_id=run_id, tool="issue_credit", arguments=ARGS)
        # The same call in tenant B is B's own intent: it runs there, and A's stays A's.
        result_b = b.run_once(run_id, "issue_credit", ARGS, lambda attempt: "b")
        assert (result_b.value, result_b.replayed) == ("b", False)
        assert a.run_once(run_id, "issue_credit", ARGS, lambda attempt: "again").value == "a"


def test_reconcile_hands_out_only_the_callers_entries(auth_server: LedgerServer,
                                                      run_id: str) -> None:
    tool = f"tool-{run_id}"
    with Ledger(auth_server.address, token="token-a") as a, \
            Ledger(auth_server.address, token="token-b") as b:
        claim = a.claim(run_id, tool, {})
        a.complete(claim.key, claim.claim_token, Status.UNKNOWN, error="timed out")
        assert b.reconcile(tool=tool).pending == []
        assert [e.key for e in a.reconcile(tool=tool).pending] == [claim.key]
        assert b.claim(run_id, tool, {}).outcome == Outcome.CLAIMED
