"""Riding out a failover: Claim, Lookup, RenewLease and Complete that meet UNAVAILABLE are sent
again after the server's RetryInfo delay within the retry budget, so a restart of the ledger's
PostgreSQL, or a cut between client and server, in the middle of run_once changes no outcome and
nothing the model reads. A real PostgreSQL cluster the test starts and restarts, a real TCP proxy
the test cuts, the real server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults import Postgres, Proxy
from scenario import CREDIT, REPLAY_NOTE, Payments

from idempotency_ledger import AsyncLedger, Ledger, Status, current_attempt
from idempotency_ledger.testing import LedgerServer

# The outage: long enough that a client without retries fails, short enough for a suite.
OUTAGE = 3.0


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    cluster = Postgres().start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def pg_server(ledger_bin: Path, postgres: Postgres,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerServer]:
    server = LedgerServer(ledger_bin, directory=tmp_path_factory.mktemp("ledger-pg"),
                          database_url=postgres.url).start()
    try:
        yield server
    finally:
        server.stop()


def later(seconds: float, what: object) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), what()), daemon=True)
    thread.start()
    return thread


def test_a_database_restart_in_the_middle_of_run_once_changes_nothing_the_model_reads(
        pg_server: LedgerServer, postgres: Postgres, run_id: str) -> None:
    payments = Payments(delay=0)
    restarted: list[threading.Thread] = []
    with Ledger(pg_server.address) as ledger:
        @ledger.tool(run_id=run_id)
        def issue_credit(customer: str, amount: int, currency: str) -> dict:
            credit = payments.issue_credit(customer, amount, currency,
                                           current_attempt().external_ref)
            # The database crashes after the credit went through, before the Complete; it is
            # back a few seconds later, as after a failover.
            postgres.stop("immediate")
            restarted.append(later(OUTAGE, postgres.start))
            return credit

        first = issue_credit(**CREDIT)
        restarted[0].join(60)
        assert first == {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}
        entry = ledger.lookup(run_id=run_id, tool="issue_credit", arguments=CREDIT)
        assert (entry.status, entry.attempt) == (Status.SUCCEEDED, 1)
        assert issue_credit(**CREDIT) == {"status": "already_done", "note": REPLAY_NOTE,
                                          "result": first}
        # The database is down when the next call claims: the claim waits it out.
        postgres.stop("immediate")
        back = later(OUTAGE, postgres.start)
        reply = ledger.run_once(f"{run_id}-2", "send_reply", {"ticket": "t-1"},
                                lambda attempt: {"sent": attempt.number})
        back.join(60)
        assert (reply.value, reply.replayed) == ({"sent": 1}, False)
    assert len(payments.credits) == 1
    assert "STORE_UNAVAILABLE" in pg_server.log()  # the server did answer UNAVAILABLE


def test_a_cut_connection_in_the_middle_of_run_once_changes_nothing_the_model_reads(
        fresh_server: LedgerServer, run_id: str) -> None:
    payments = Payments(delay=0)
    proxy = Proxy(fresh_server.address)
    try:
        with Ledger(proxy.address) as ledger:
            @ledger.tool(run_id=run_id)
            def issue_credit(customer: str, amount: int, currency: str) -> dict:
                credit = payments.issue_credit(customer, amount, currency,
                                               current_attempt().external_ref)
                proxy.cut()  # the network between the agent and the ledger goes away
                later(OUTAGE, proxy.restore)
                return credit

            first = issue_credit(**CREDIT)
            assert first["credit_id"] == "cr-001"
            assert issue_credit(**CREDIT)["status"] == "already_done"
            assert ledger.lookup(run_id=run_id, tool="issue_credit",
                                 arguments=CREDIT).status == Status.SUCCEEDED
            # Cut before the claim: it is sent again until the network is back.
            proxy.cut()
            later(OUTAGE, proxy.restore)
            again = issue_credit(**{**CREDIT, "amount": 300})
            assert again["credit_id"] == "cr-002"
        assert proxy.connections >= 2  # the channel connected again after each cut
    finally:
        proxy.close()
    assert len(payments.credits) == 2


def test_the_asyncio_client_rides_out_a_cut_too(fresh_server: LedgerServer,
                                                run_id: str) -> None:
    payments = Payments(delay=0)
    proxy = Proxy(fresh_server.address)

    async def main() -> None:
        async with AsyncLedger(proxy.address) as ledger:
            async def credit(attempt):  # noqa: ANN001, ANN202
                done = payments.issue_credit(**CREDIT, reference=attempt.external_ref)
                proxy.cut()
                later(OUTAGE, proxy.restore)
                return done

            result = await ledger.run_once(run_id, "issue_credit", CREDIT, credit)
            assert (result.replayed, result.entry.status) == (False, Status.SUCCEEDED)
            replay = await ledger.run_once(run_id, "issue_credit", CREDIT, credit)
            assert replay.replayed and replay.value == result.value
            proxy.cut()  # before the claim, this time
            later(OUTAGE, proxy.restore)
            other = await ledger.run_once(f"{run_id}-2", "send_reply", {"ticket": "t-1"},
                                          lambda attempt: {"sent": attempt.number})
            assert (other.value, other.replayed) == ({"sent": 1}, False)

    try:
        asyncio.run(main())
    finally:
        proxy.close()
    assert len(payments.credits) == 1


def test_the_budget_bounds_the_retries(fresh_server: LedgerServer, run_id: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    proxy = Proxy(fresh_server.address)
    try:
        with Ledger(proxy.address, retry_budget=1) as ledger:
            proxy.cut()  # and never restored: the claim gives up after its budget
            started = time.monotonic()
            with caplog.at_level("INFO", logger="idempotency_ledger"), \
                    pytest.raises(Exception, match="UNAVAILABLE"):
                ledger.claim(run_id, "t", {})
            spent = time.monotonic() - started
    finally:
        proxy.close()
    # It did send the claim again before giving up: backoffs of 0.1-0.15 s and 0.2-0.3 s always
    # fit in a budget of one second (a third, 0.4-0.6 s, may not: jitter decides).
    again = [r for r in caplog.records if "sending it again" in r.getMessage()]
    assert len(again) >= 2, [r.getMessage() for r in caplog.records]
    assert spent < 1 + 2  # within the budget, plus the last attempt's own failure
