"""list_entries: pages through ListEntries as an iterator (sync and asyncio), with filters, and
entries carry the arguments the server kept for audit."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from idempotency_ledger import AsyncLedger, Entry, Ledger, Status
from idempotency_ledger.testing import LedgerServer

#: More than two pages of PAGE entries, so the iteration must follow two page tokens.
COUNT = 23
PAGE = 10


def _fill(ledger: Ledger, run_id: str) -> dict[str, int]:
    """COUNT entries in `run_id`: every fifth left in flight, the others succeeded. Returns
    key -> n."""
    keys = {}
    for n in range(COUNT):
        claim = ledger.claim(run_id, "issue_credit", {"n": n, "customer": "c-42"})
        if n % 5:
            ledger.complete(claim.key, claim.claim_token, Status.SUCCEEDED, result=b"{}")
        keys[claim.key] = n
    ledger.claim(f"{run_id}-other", "issue_credit", {"n": 0})
    return keys


def _check_listing(listed: list[Entry], keys: dict[str, int], run_id: str) -> None:
    assert len(listed) == COUNT
    assert {e.key for e in listed} == set(keys), "no gaps, no repeats, nothing of another run"
    assert all(e.run_id == run_id for e in listed)
    started = [e.started_at for e in listed]
    assert started == sorted(started), "oldest attempt first"
    for e in listed:
        assert e.arguments_json == f'{{"customer":"c-42","n":{keys[e.key]}}}'


def test_list_entries_pages_through_a_run_without_gaps_or_repeats(
    ledger: Ledger, run_id: str
) -> None:
    keys = _fill(ledger, run_id)
    _check_listing(list(ledger.list_entries(run_id=run_id, page_size=PAGE)), keys, run_id)
    # The default page size holds them all: the same entries.
    assert [e.key for e in ledger.list_entries(run_id=run_id)] == [
        e.key for e in ledger.list_entries(run_id=run_id, page_size=PAGE)
    ]


def test_list_entries_filters_by_status_tool_and_time(ledger: Ledger, run_id: str) -> None:
    keys = _fill(ledger, run_id)
    attempting = list(ledger.list_entries(run_id=run_id, status="ATTEMPTING", page_size=2))
    assert sorted(keys[e.key] for e in attempting) == [0, 5, 10, 15, 20]
    assert all(e.status == Status.ATTEMPTING for e in attempting)
    succeeded = list(ledger.list_entries(run_id=run_id, status=Status.SUCCEEDED))
    assert len(succeeded) == COUNT - 5
    assert list(ledger.list_entries(run_id=run_id, tool="send_reply")) == []
    future = datetime.now(UTC) + timedelta(hours=1)
    assert list(ledger.list_entries(run_id=run_id, started_after=future)) == []
    assert len(list(ledger.list_entries(run_id=run_id, started_before=future))) == COUNT
    # Lookup and the listing tell the same entry.
    first = next(iter(ledger.list_entries(run_id=run_id, page_size=1)))
    assert ledger.lookup(first.key) == first


def test_async_list_entries_is_an_async_iterator_over_every_page(
    server: LedgerServer, ledger: Ledger, run_id: str
) -> None:
    keys = _fill(ledger, run_id)

    async def main() -> list[Entry]:
        async with AsyncLedger(server.address, timeout=10) as client:
            return [e async for e in client.list_entries(run_id=run_id, page_size=PAGE)]

    _check_listing(asyncio.run(main()), keys, run_id)
