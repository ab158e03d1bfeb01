"""The Reconciler, blocking and asyncio, and its console entry point: it settles the unknown
outcomes of the tools it is given with their confirm, and of those only, in a store that also
holds other tools' unknown entries; against the real server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from scenario import CREDIT, Payments

from idempotency_ledger import (
    AsyncLedger,
    Ledger,
    LedgerTool,
    Reconciler,
    Status,
    UnknownAttempt,
    cannot_tell,
)
from idempotency_ledger.testing import LedgerServer

PARITY = json.loads(
    (Path(__file__).resolve().parents[2] / "parity.json").read_text(encoding="utf-8"))


def unknown(ledger: Ledger, run_id: str, tool: str, args: dict) -> str:
    """An entry whose outcome nobody knows (its claimant timed out); its key."""
    claimed = ledger.claim(run_id, tool, args)
    ledger.complete(claimed.key, claimed.claim_token, Status.UNKNOWN, error="TimeoutError")
    return claimed.key


def store_with_unknowns(ledger: Ledger, payments: Payments) -> dict[str, str]:
    """issue_credit: one that happened, one that did not, one nobody can tell; and unknown
    entries of two other tools the reconciler is not given."""
    keys = {name: unknown(ledger, f"run-{name}", "issue_credit", {**CREDIT, "customer": name})
            for name in ("found", "absent", "unsure")}
    payments.issue_credit("found", 200, "EUR", ledger.lookup(keys["found"]).external_ref)
    keys["reply"] = unknown(ledger, "run-x", "send_reply", {"ticket": "t-1", "text": "hi"})
    keys["refund"] = unknown(ledger, "run-x", "refund", {"order": "o-1"})
    return keys


def credit_confirm(payments: Payments):  # noqa: ANN201
    def confirm(attempt: UnknownAttempt):  # noqa: ANN202
        if attempt.arguments["customer"] == "unsure":
            return cannot_tell("the payments API is down")
        return payments.confirm(attempt)

    return confirm


def test_a_round_settles_only_its_tools_entries(fresh_server: LedgerServer,
                                                caplog: pytest.LogCaptureFixture) -> None:
    payments = Payments(delay=0)
    with Ledger(fresh_server.address) as ledger:
        keys = store_with_unknowns(ledger, payments)

        @ledger.tool(run_id="r", confirm=credit_confirm(payments))
        def issue_credit(customer: str, amount: int, currency: str) -> dict:
            raise AssertionError("the reconciler never calls the tool")

        reconciler = Reconciler(ledger, [issue_credit], older_than=0,
                                principal="reconciler-test")
        assert list(reconciler.tools) == ["issue_credit"]
        with caplog.at_level(logging.INFO, logger="idempotency_ledger"):
            settled = reconciler.run_round()
        outcomes = {s.key: (s.outcome, s.status) for s in settled}
        assert outcomes == {keys["found"]: ("found", Status.SUCCEEDED),
                            keys["absent"]: ("not_found", Status.FAILED),
                            keys["unsure"]: ("cannot_tell", Status.UNKNOWN)}
        # Who settled each (the TypeScript SettlementRecord's resolvedBy): nobody for cannot tell.
        assert {s.key: s.who for s in settled} == {keys["found"]: "reconciler-test",
                                                   keys["absent"]: "reconciler-test",
                                                   keys["unsure"]: ""}
        found = ledger.lookup(keys["found"])
        assert (found.status, found.resolved_by) == (Status.SUCCEEDED, "reconciler-test")
        assert found.result == b'{"credit_id":"cr-001","amount":200,"currency":"EUR"}'
        absent = ledger.lookup(keys["absent"])
        assert (absent.status, absent.retryable) == (Status.FAILED, True)
        # The other tools' entries, and the one it could not tell about, are as they were.
        for name in ("unsure", "reply", "refund"):
            entry = ledger.lookup(keys[name])
            assert (entry.status, entry.resolved_by) == (Status.UNKNOWN, ""), name
        # Every settlement is logged with its key, tool, external_ref, outcome and who, as
        # clients/parity.json's settlement.log_line says (the TypeScript client's line).
        # The line names a resolved_by only when the entry records one: the one it could not
        # tell about stays unresolved (settled_by=nobody).
        for key, (outcome, status) in outcomes.items():
            line = next(r.getMessage() for r in caplog.records if f"key={key}" in r.getMessage())
            entry = ledger.lookup(key)
            expected = PARITY["settlement"]["log_line"].format(
                key=key, tool="issue_credit", external_ref=entry.external_ref, outcome=outcome,
                status=status.name, resolved_by=entry.resolved_by, via="reconciler")
            if not entry.resolved_by:
                expected = expected.replace("resolved_by=", "settled_by=nobody")
            assert line == expected
        # The confirm was asked with the arguments as the ledger keeps them.
        assert {a.arguments["customer"] for a in payments.confirmed} == {"found", "absent"}
        assert reconciler.run_round() == []  # the unsure one is held for a while; nothing else


def test_the_reconciler_runs_beside_the_agent_and_stops(fresh_server: LedgerServer) -> None:
    payments = Payments(delay=0)
    with Ledger(fresh_server.address) as ledger:
        keys = store_with_unknowns(ledger, payments)
        reconciler = Reconciler(ledger, [LedgerTool("issue_credit", credit_confirm(payments))],
                                older_than=0, interval=0.05).start()
        deadline = time.monotonic() + 20
        while ledger.lookup(keys["absent"]).status == Status.UNKNOWN:
            assert time.monotonic() < deadline, "the background reconciler settled nothing"
            time.sleep(0.05)
        reconciler.stop()
        assert not reconciler._thread.is_alive()  # noqa: SLF001
        assert ledger.lookup(keys["found"]).status == Status.SUCCEEDED
        assert ledger.lookup(keys["reply"]).status == Status.UNKNOWN


def test_the_asyncio_reconciler_runs_as_a_task(fresh_server: LedgerServer) -> None:
    payments = Payments(delay=0)
    with Ledger(fresh_server.address) as setup:
        keys = store_with_unknowns(setup, payments)

    async def confirm(attempt: UnknownAttempt):  # noqa: ANN202 (a coroutine confirm)
        await asyncio.sleep(0)
        return credit_confirm(payments)(attempt)

    async def main() -> None:
        async with AsyncLedger(fresh_server.address) as ledger:
            reconciler = Reconciler(ledger, {"issue_credit": confirm}, older_than=0,
                                    interval=0.05).start()
            for _ in range(400):
                if (await ledger.lookup(keys["found"])).status == Status.SUCCEEDED:
                    break
                await asyncio.sleep(0.05)
            reconciler.stop()
            await asyncio.wait_for(reconciler.stopped(), 10)
            assert (await ledger.lookup(keys["absent"])).status == Status.FAILED
            assert (await ledger.lookup(keys["refund"])).status == Status.UNKNOWN

    asyncio.run(main())


def test_a_tool_without_a_confirm_is_refused_when_the_reconciler_is_made(
        server: LedgerServer) -> None:
    # A reconciler given a tool it cannot ask would silently never settle it: refused, naming
    # the tool, however the tool is given (clients/parity.json, reconciler_tools; the
    # TypeScript Reconciler throws a TypeError).
    refusal = PARITY["reconciler_tools"]["without_confirm"]
    assert refusal["python"] == "ValueError"
    with Ledger(server.address) as ledger:
        @ledger.tool(run_id="r", confirm=lambda attempt: cannot_tell())
        def issue_credit(customer: str) -> dict:
            raise AssertionError("never called")

        @ledger.tool(run_id="r")  # no paired read
        def send_reply(ticket: str, text: str) -> dict:
            raise AssertionError("never called")

        for tools in ([issue_credit, send_reply], [LedgerTool("send_reply")],
                      {"issue_credit": issue_credit.ledger_tool.confirm, "send_reply": None}):
            with pytest.raises(ValueError, match="tool send_reply has no confirm: a reconciler "
                                                 "cannot ask") as refused:
                Reconciler(ledger, tools)
            assert "issue_credit" not in str(refused.value)
        with pytest.raises(ValueError, match="no tools given"):
            Reconciler(ledger, [])
        with pytest.raises(TypeError, match="is not a ledger tool"):
            Reconciler(ledger, [object()])


def test_failing_rounds_back_off_and_the_loop_goes_on(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    # Nobody listens at the address: every round fails; the pauses grow, and stop() ends it.
    with Ledger("127.0.0.1:9", timeout=0.5, retry_budget=0) as ledger:
        reconciler = Reconciler(ledger, {"t": lambda a: cannot_tell()}, interval=0.05,
                                max_backoff=0.2)
        assert all(reconciler._next_pause(n) <= 0.2 for n in range(1, 8))  # noqa: SLF001
        assert reconciler._next_pause(0) == 0.05  # noqa: SLF001
        with caplog.at_level(logging.WARNING):
            reconciler.start()
            time.sleep(1.5)
            reconciler.stop()
    failures = [r for r in caplog.records if "round failed" in r.getMessage()]
    assert 2 <= len(failures) < 30  # it kept going, with pauses between rounds


def write_tools_module(directory: Path) -> str:
    (directory / "shop_tools.py").write_text(textwrap.dedent('''
        import json, os
        from idempotency_ledger import found, not_found

        def find_credit(attempt):
            credits = json.loads(open(os.environ["SHOP_CREDITS"]).read())
            credit = credits.get(attempt.external_ref)
            return found(credit) if credit else not_found("no such credit")

        TOOLS = {"issue_credit": find_credit}
    '''))
    return "shop_tools:TOOLS"


def entry_point() -> list[str]:
    script = shutil.which("idempotency-ledger-reconciler",
                          path=str(Path(sys.executable).parent))
    assert script, "the console entry point is not installed"
    return [script]


def test_the_console_entry_point_loads_the_tools_module(fresh_server: LedgerServer,
                                                        tmp_path: Path) -> None:
    with Ledger(fresh_server.address) as ledger:
        found_key = unknown(ledger, "run-1", "issue_credit", CREDIT)
        absent_key = unknown(ledger, "run-2", "issue_credit", CREDIT)
        other_key = unknown(ledger, "run-1", "send_reply", {"ticket": "t-1"})
        credits = tmp_path / "credits.json"
        credits.write_text(f'{{"{ledger.lookup(found_key).external_ref}": {{"credit_id": "c"}}}}')
        done = subprocess.run(
            [*entry_point(), write_tools_module(tmp_path), "--target", fresh_server.address,
             "--older-than", "0", "--once", "--principal", "cli"],
            cwd=tmp_path, env={**os.environ, "SHOP_CREDITS": str(credits)},
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"key={found_key}" in done.stderr and "outcome=found" in done.stderr
        assert ledger.lookup(found_key).status == Status.SUCCEEDED
        assert ledger.lookup(absent_key).status == Status.FAILED
        assert ledger.lookup(other_key).status == Status.UNKNOWN
        assert ledger.lookup(found_key).resolved_by == "cli"


def test_the_console_entry_point_stops_cleanly_on_sigterm(fresh_server: LedgerServer,
                                                          tmp_path: Path) -> None:
    credits = tmp_path / "credits.json"
    credits.write_text("{}")
    process = subprocess.Popen(
        [*entry_point(), write_tools_module(tmp_path), "--target", fresh_server.address,
         "--interval", "0.1"],
        cwd=tmp_path, env={**os.environ, "SHOP_CREDITS": str(credits)},
        stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # it started: "reconciling issue_credit against ..."
        assert "reconciling issue_credit" in line, line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
