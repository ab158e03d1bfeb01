"""The gateway in front of a running ledger server (``--ledger URL --ledger-token TOKEN``)
instead of a store of its own: the calls are the server's entries, in the token's tenant, so
the server's approvers, Lookup and reconcilers see them; the window of intent is counted by the
server (the Claim's ``same_intent_within``), so gateways on one server share it. Real server,
real gateways, the official Python SDK's client, the counted upstream."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from gateway import (Gateway, http_gateway, http_upstream, identical_calls_over_two, intent_of,
                     texts)
from mcp import Client
from mcp.shared.exceptions import MCPError

from idempotency_ledger import Ledger
from idempotency_ledger.testing import LedgerServer

EMAIL = {"to": "ops@example.com", "subject": "the weekly report"}
#: The gateway's credential (tenant acme), one with the approver role (for
#: ``--approvals-at-client``), and a person's, all on the server.
GATEWAY_TOKEN = "tok-gateway"
GATEWAY_APPROVER_TOKEN = "tok-gateway-asks-people"
PERSON_TOKEN = "tok-dana"


@pytest.fixture
def server(ledger_bin: Path, tmp_path: Path) -> Iterator[LedgerServer]:
    running = LedgerServer(ledger_bin, directory=tmp_path / "server",
                           tokens={"acme": GATEWAY_TOKEN, "globex": "tok-globex"},
                           approvers={PERSON_TOKEN: ("acme", "dana"),
                                      GATEWAY_APPROVER_TOKEN: ("acme", "gateway")}).start()
    try:
        yield running
    finally:
        running.stop()


def remote(ledger_bin: Path, tmp_path: Path, server: LedgerServer, *flags: str,
           policy: str | None = None, token: str = GATEWAY_TOKEN) -> Gateway:
    return Gateway(ledger_bin, tmp_path, list(flags), policy,
                   ledger=(f"http://{server.address}", token))


def entries(server: LedgerServer, token: str = GATEWAY_TOKEN) -> list[tuple[str, str, str]]:
    """The server's entries of the token's tenant: (tool, status, run_id), oldest first."""
    with Ledger(server.address, token=token, timeout=10) as ledger:
        return [(e.tool, e.status.name, intent_of(e.run_id)) for e in ledger.list_entries()]


def test_calls_through_a_ledger_server_act_once_per_window_and_are_the_servers_entries(
        ledger_bin: Path, tmp_path: Path, server: LedgerServer) -> None:
    gw = remote(ledger_bin, tmp_path, server, "--same-intent-within", "3s")

    async def session(*runs: str | None) -> list[Any]:
        async with Client(gw.params(), mode="legacy") as client:
            return [await client.call_tool("send_email", EMAIL,
                                           meta={"idempotency-ledger/run": run} if run else None)
                    for run in runs]

    first, repeat = anyio.run(session, None, None)
    restarted = anyio.run(session, None)[0]
    time.sleep(3.5)
    later, named, named_again = anyio.run(session, None, "run-7", "run-7")
    assert texts(first)[0] == "sent #1 to ops@example.com: the weekly report"
    for again in (repeat, restarted, named_again):
        assert again.meta["idempotency-ledger/replayed"] is True, texts(again)
    assert texts(later)[0].startswith("sent #2"), "after a quiet window: a new intent"
    assert texts(named)[0].startswith("sent #3"), "a run named in _meta is its own"
    assert len(gw.effects()) == 3
    assert sorted(entries(server)) == [
        ("counted-upstream/send_email", "SUCCEEDED", "run-7"),
        ("counted-upstream/send_email", "SUCCEEDED", "window-1"),
        ("counted-upstream/send_email", "SUCCEEDED", "window-2")]
    assert entries(server, "tok-globex") == [], "the token's tenant, no other"


def test_identical_calls_over_two_gateways_on_one_ledger_server_act_once(
        ledger_bin: Path, tmp_path: Path, server: LedgerServer) -> None:
    gw = remote(ledger_bin, tmp_path, server)
    slow = {"to": "ops@example.com", "subject": "together", "seconds": 0.5}
    with http_upstream(gw) as upstream, http_gateway(gw, upstream) as first, \
            http_gateway(gw, upstream) as second:
        results = identical_calls_over_two(first, second, 8, slow)
    assert all(not r.is_error for r in results), [texts(r) for r in results if r.is_error]
    assert len(gw.effects()) == 1, gw.effects()
    assert sum(1 for r in results if (r.meta or {}).get("idempotency-ledger/replayed")) == 7
    assert entries(server) == [("counted-upstream/slow_send", "SUCCEEDED", "window-1")]


def test_a_gated_call_is_decided_by_the_servers_approver_and_acts_once_denied_never(
        ledger_bin: Path, tmp_path: Path, server: LedgerServer) -> None:
    gw = remote(ledger_bin, tmp_path, server, policy="send_email gate\n")
    refund = {"to": "billing@example.com", "subject": "refund 900"}

    async def once(arguments: dict[str, str]) -> Any:
        async with Client(gw.params(), mode="legacy") as client:
            return await client.call_tool("send_email", arguments)

    asked, other = anyio.run(once, EMAIL), anyio.run(once, refund)
    assert asked.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL"
    assert gw.calls() == [], "nothing is sent before a decision"
    with Ledger(server.address, token=PERSON_TOKEN, timeout=10) as person:
        for result, verdict in [(asked, "approve"), (other, "deny")]:
            key = result.meta["idempotency-ledger/key"]
            person.decide(key, person.lookup(key=key).fingerprint, verdict, "checked")
    approved, again, denied = anyio.run(once, EMAIL), anyio.run(once, EMAIL), anyio.run(once, refund)
    assert not approved.is_error and texts(approved)[0].startswith("sent #1"), texts(approved)
    assert again.meta["idempotency-ledger/replayed"] is True
    assert denied.meta["idempotency-ledger/status"] == "DENIED" and "checked" in texts(denied)[0]
    assert len(gw.effects()) == 1, "the approved call once, the denied never"


def test_a_person_asked_at_the_client_decides_on_the_server_under_the_gateways_approver_role(
        ledger_bin: Path, tmp_path: Path, server: LedgerServer) -> None:
    from mcp import types

    async def person(context: Any, params: Any) -> Any:
        return types.ElicitResult(action="accept", content={"approve": True, "reason": "ok"})

    def ask(token: str) -> Any:
        gw = remote(ledger_bin, tmp_path / token, server, "--approvals-at-client",
                    policy="send_email gate\n", token=token)
        gw.directory.mkdir(parents=True, exist_ok=True)

        async def main() -> Any:
            async with Client(gw.params(), mode="legacy", elicitation_callback=person) as client:
                return await client.call_tool("send_email", {**EMAIL, "subject": token})
        return gw, anyio.run(main)

    without_role, awaiting = ask(GATEWAY_TOKEN)
    with_role, acted = ask(GATEWAY_APPROVER_TOKEN)
    assert awaiting.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL", \
        "the server refused the gateway's Decide: its token has no approver role"
    assert without_role.effects() == []
    assert texts(acted)[0].startswith("sent #1"), texts(acted)
    with Ledger(server.address, token=GATEWAY_TOKEN, timeout=10) as ledger:
        [decided] = [e.approval for e in ledger.list_entries(status="SUCCEEDED")]
    assert decided.decided_by == "gateway", "the server records the credential that decided"
    assert "decided by person at" in decided.reason and "ok" in decided.reason


def test_a_lost_answer_is_settled_through_the_servers_reconcile(
        ledger_bin: Path, tmp_path: Path, server: LedgerServer) -> None:
    gw = remote(ledger_bin, tmp_path, server, "--confirm-after", "0s",
                policy="send_then_die confirm find_email subject=/subject found=/found\n")

    async def main() -> tuple[Any, Any]:
        async with Client(gw.params(), mode="legacy") as client:
            return (await client.call_tool("send_then_die", EMAIL),
                    await client.call_tool("send_then_die", EMAIL))

    lost, again = anyio.run(main)
    assert lost.meta["idempotency-ledger/status"] == "SUCCEEDED" and "found its effect" in \
        texts(lost)[0], texts(lost)
    assert again.meta["idempotency-ledger/replayed"] is True
    assert len(gw.calls("send_then_die")) == 1 and len(gw.effects()) == 1
    assert [status for _, status, _ in entries(server)] == ["SUCCEEDED"]


def test_a_ledger_server_that_refuses_or_cannot_be_reached_means_the_call_is_not_sent(
        ledger_bin: Path, tmp_path: Path, server: LedgerServer) -> None:
    wrong = remote(ledger_bin, tmp_path / "wrong", server, token="tok-nobody")
    wrong.directory.mkdir()
    gone = Gateway(ledger_bin, tmp_path / "gone", [], None,
                   ledger=(f"http://127.0.0.1:{free_port()}", GATEWAY_TOKEN))
    gone.directory.mkdir()

    async def call(gw: Gateway) -> str:
        async with Client(gw.params(), mode="legacy") as client:
            with pytest.raises(MCPError) as refused:
                await client.call_tool("send_email", EMAIL)
            return str(refused.value)

    for gw in (wrong, gone):
        message = anyio.run(call, gw)
        assert "could not record the call, so it was not sent" in message, message
        assert gw.calls() == [], "nothing was forwarded"
    assert entries(server) == []


def test_a_gateway_on_a_ledger_server_refuses_a_tokens_file_of_several_tenants(
        ledger_bin: Path, tmp_path: Path) -> None:
    """Every call goes to the --ledger-token's tenant: clients of several tenants would share
    their intents, so the gateway does not start."""
    tokens = tmp_path / "tokens"
    tokens.write_text("acme tok-a\nglobex tok-g\n")
    process = subprocess.run(
        [str(ledger_bin), "mcp", "--ledger", "http://127.0.0.1:9", "--ledger-token", "t",
         "--auth-tokens-file", str(tokens), "--listen", "127.0.0.1:0",
         "--upstream", "http://127.0.0.1:9/mcp"],
        capture_output=True, text=True, timeout=30)
    assert process.returncode != 0
    assert "names 2 tenants" in process.stderr and "one gateway per tenant" in process.stderr, \
        process.stderr


def free_port() -> int:
    from gateway import free_port as port
    return port()
