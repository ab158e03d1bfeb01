"""The MCP gateway over Streamable HTTP (``idempotency-ledger mcp --listen ADDR --upstream
URL``), driven by the official Python SDK's client on 2026-07-28 and the initialize handshake,
in front of the counted upstream served over HTTP: a call re-issued after its stream was cut
acts once, tenants are kept apart by their tokens, and what the edge refuses is neither stored
nor forwarded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from gateway import (STATELESS_META, Gateway, http_gateway, http_upstream,
                     identical_calls_over_two, post, postgres, texts, tool_call)
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

EMAIL = {"to": "ops@example.com", "subject": "the weekly report"}


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_a_call_reissued_after_its_stream_was_cut_acts_once(
        ledger_bin: Path, tmp_path: Path, mode: str) -> None:
    gw = Gateway(ledger_bin, tmp_path)
    slow = {"to": "ops@example.com", "subject": "slow", "seconds": 1.5}
    with http_upstream(gw) as upstream, http_gateway(gw, upstream) as url:

        async def main() -> Any:
            async with Client(url, mode=mode) as client:
                # The client gives up on the first answer (its stream is cut) after the call
                # went on; it re-issues the call, with a new request id.
                with pytest.raises(Exception):
                    await client.call_tool("slow_send", slow, read_timeout_seconds=0.3)
                return await client.call_tool("slow_send", slow)

        again = anyio.run(main)
    assert len(gw.effects()) == 1, gw.effects()
    assert len(gw.calls("slow_send")) == 1, "the re-issued call was not forwarded"
    assert not again.is_error
    assert texts(again)[0].startswith("sent #1"), "the first call's result"
    assert again.meta["idempotency-ledger/replayed"] is True


def test_each_tenant_has_its_own_intents(ledger_bin: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("acme tok-acme\nglobex tok-globex\n", encoding="utf-8")
    gw = Gateway(ledger_bin, tmp_path)
    with http_upstream(gw) as upstream, \
            http_gateway(gw, upstream, "--auth-tokens-file", str(tokens)) as url:

        async def call_as(token: str) -> Any:
            headers = {"authorization": f"Bearer {token}"}
            async with httpx2.AsyncClient(headers=headers) as http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport, mode="2026-07-28") as client:
                    return await client.call_tool("send_email", EMAIL)

        for token in ["tok-acme", "tok-acme", "tok-globex"]:
            anyio.run(call_as, token)
        refused = post(url, json.dumps(tool_call(1, "send_email", EMAIL)))
    assert refused.status_code == 401, "no token, no call"
    assert len(gw.effects()) == 2, "acme once, globex once"
    with __import__("sqlite3").connect(gw.database) as db:
        tenants = sorted(t for (t,) in db.execute("SELECT tenant FROM ledger_entries"))
    assert tenants == ["acme", "globex"]


def test_what_the_edge_refuses_is_neither_stored_nor_forwarded(ledger_bin: Path,
                                                                tmp_path: Path) -> None:
    gw = Gateway(ledger_bin, tmp_path)
    call = tool_call(1, "send_email", EMAIL)
    with http_upstream(gw) as upstream, \
            http_gateway(gw, upstream, "--max-body-bytes", "2048") as url:
        not_json = post(url, "this is not JSON")
        not_an_object = post(url, json.dumps(tool_call(1, "send_email", [1, 2])))
        no_name = post(url, json.dumps(tool_call(1, None, EMAIL)))
        too_big = post(url, json.dumps(tool_call(1, "send_email", {**EMAIL, "body": "x" * 4096})))
        evil = post(url, json.dumps(call), {"origin": "http://evil.example"})
        batch = post(url, json.dumps([call]))
        invalid = post(url, json.dumps({"jsonrpc": "1.0", "id": 2, "method": "tools/call"}))
        alive = post(url, json.dumps(call), {"origin": "http://localhost:6274"})
    assert (not_json.status_code, not_json.json()["error"]["code"]) == (400, -32700)
    assert not_an_object.json()["error"]["code"] == -32602
    assert no_name.json()["error"]["code"] == -32602
    assert too_big.status_code == 413
    assert evil.status_code == 403
    assert batch.status_code == 400 and "batch" in batch.json()["error"]["message"]
    assert invalid.json()["error"]["code"] == -32600
    assert alive.status_code == 200, alive.text
    assert alive.json()["result"]["content"][0]["text"].startswith("sent #1")
    assert len(gw.calls("send_email")) == 1, "only the call that passed was forwarded"
    assert len(gw.entries()) == 1, "only the call that passed was stored"


def test_sixteen_identical_calls_over_two_replicas_on_one_postgres_act_once(
        ledger_bin: Path, tmp_path: Path) -> None:
    gw = Gateway(ledger_bin, tmp_path)
    slow = {"to": "ops@example.com", "subject": "together", "seconds": 0.5}
    with postgres() as database, http_upstream(gw) as upstream, \
            http_gateway(gw, upstream, database_url=database) as first, \
            http_gateway(gw, upstream, database_url=database) as second:
        results = identical_calls_over_two(first, second, 16, slow)
    assert len(results) == 16
    assert all(not r.is_error for r in results), [texts(r) for r in results if r.is_error]
    assert len(gw.effects()) == 1, gw.effects()
    assert len(gw.calls("slow_send")) == 1
    replays = sum(1 for r in results if r.meta and r.meta.get("idempotency-ledger/replayed"))
    assert replays == 15


def test_a_question_asked_by_one_replica_is_answered_at_another_that_shares_its_seal(
        ledger_bin: Path, tmp_path: Path) -> None:
    """``--approvals-at-client`` over HTTP on one PostgreSQL: the person's answer to the
    question one replica asked acts once at the replica that shares its seal file; at a replica
    with a key of its own it decides nothing (the person is asked again)."""
    gw = Gateway(ledger_bin, tmp_path, ["--approvals-at-client"], "send_email gate\n")
    seal = tmp_path / "seal"
    seal.write_bytes(bytes(range(32)))
    shared = ("--approvals-seal-file", str(seal))
    can_be_asked = {**STATELESS_META,
                    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}}}

    def call(url: str, id: int, answer: dict[str, Any] | None = None) -> dict[str, Any]:
        message = tool_call(id, "send_email", EMAIL)
        message["params"]["_meta"] = can_be_asked
        if answer is not None:
            message["params"].update(answer)
        response = post(url, json.dumps(message))
        assert response.status_code == 200, response.text
        return response.json()["result"]

    with postgres() as database, http_upstream(gw) as upstream, \
            http_gateway(gw, upstream, *shared, database_url=database) as first, \
            http_gateway(gw, upstream, *shared, database_url=database) as second, \
            http_gateway(gw, upstream, database_url=database) as own_key:
        asked = call(first, 1)
        assert asked["resultType"] == "input_required", asked
        answer = {"requestState": asked["requestState"],
                  "inputResponses": {"idempotency-ledger/approval": {
                      "action": "accept", "content": {"approve": True}}}}
        elsewhere = call(own_key, 2, answer)
        sent_before = len(gw.calls("send_email"))
        acted = call(second, 3, answer)
    assert elsewhere["resultType"] == "input_required", "another key: asked again"
    assert sent_before == 0, "nothing was sent on an answer the replica could not open"
    assert acted["content"][0]["text"].startswith("sent #1"), acted
    assert len(gw.effects()) == 1


def test_a_session_based_client_over_http_is_asked_on_its_calls_stream_and_acts_once_approved(
        ledger_bin: Path, tmp_path: Path) -> None:
    """``--approvals-at-client`` for a session-based client over HTTP (2025-11-25): the call's
    response turns into an event stream carrying the gateway's ``elicitation/create``, the
    client POSTs its answer back, and the call goes on: approved acts once, denied never; a
    client that did not declare it can be asked is not."""
    from mcp import types

    gw = Gateway(ledger_bin, tmp_path, ["--approvals-at-client"], "send_email gate\n")
    shown: list[str] = []

    def person(answer: dict[str, Any]) -> Any:
        async def answering(context: Any, params: Any) -> Any:
            shown.append(params.message)
            return types.ElicitResult(action="accept", content=answer)
        return answering

    with http_upstream(gw) as upstream, http_gateway(gw, upstream) as url:

        async def ask(arguments: dict[str, str], answer: dict[str, Any] | None) -> Any:
            callback = person(answer) if answer is not None else None
            async with Client(url, mode="legacy", elicitation_callback=callback) as client:
                return await client.call_tool("send_email", arguments)

        refund = {"to": "billing@example.com", "subject": "refund 900"}
        approved = anyio.run(ask, EMAIL, {"approve": True, "reason": "checked"})
        again = anyio.run(ask, EMAIL, {"approve": False})
        denied = anyio.run(ask, refund, {"approve": False, "reason": "wrong customer"})
        unasked = anyio.run(ask, {**refund, "subject": "refund 901"}, None)
    assert not approved.is_error and texts(approved)[0].startswith("sent #1"), texts(approved)
    assert again.meta["idempotency-ledger/replayed"] is True, "the repeat replays, not asked"
    assert denied.meta["idempotency-ledger/status"] == "DENIED"
    assert "wrong customer" in texts(denied)[0]
    assert unasked.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL", \
        "a client that cannot be asked reads the awaiting note"
    assert len(shown) == 2 and "ops@example.com" in shown[0], shown
    assert [e["subject"] for e in gw.effects()] == ["the weekly report"], "approved once only"
    assert len(gw.calls("send_email")) == 1


def test_an_https_upstream_is_reached_when_its_certificate_chains_to_a_trusted_ca(
        ledger_bin: Path, tmp_path: Path) -> None:
    """``--upstream https://…``: with ``--upstream-ca`` naming the private CA the call acts;
    without it the certificate is refused, and the call, never sent, is a retryable failure
    (the client may simply try again) rather than an unknown outcome."""
    from gateway import certificates

    gw = Gateway(ledger_bin, tmp_path, ["--name", "counted-upstream"])
    ca, cert, key = certificates(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    other_ca, _, _ = certificates(other)
    with http_upstream(gw, tls=(cert, key)) as upstream, \
            http_gateway(gw, upstream, "--upstream-ca", str(other_ca)) as untrusting:
        refused = post(untrusting, json.dumps(tool_call(1, "send_email", EMAIL)))
        with http_gateway(gw, upstream, "--upstream-ca", str(ca)) as trusting:
            acted = post(trusting, json.dumps(tool_call(2, "send_email", EMAIL)))
    message = refused.json()["error"]["message"]
    assert "was not sent" in message and "certificate" in message, message
    assert acted.status_code == 200, acted.text
    assert acted.json()["result"]["content"][0]["text"].startswith("sent #1"), acted.text
    assert len(gw.effects()) == 1
    statuses = [status for _, status, _ in gw.entries()]
    assert statuses == ["SUCCEEDED"], "the refused attempt was retried by the next call"
