"""The MCP gateway over stdio (``idempotency-ledger mcp -- COMMAND``), driven by the official
Python SDK's client, on the current revision (2026-07-28) and a session-based one (2025-11-25
by the initialize handshake), in front of a real upstream whose effects are counted
(``gateway_upstream.py``). No line of ledger code in the client or the upstream."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from gateway import Gateway, texts
from mcp import Client

REVISIONS = ["2026-07-28", "legacy"]
EMAIL = {"to": "ops@example.com", "subject": "the weekly report"}


def gateway(ledger_bin: Path, tmp_path: Path, *flags: str, policy: str | None = None) -> Gateway:
    return Gateway(ledger_bin, tmp_path, list(flags), policy)


async def call(gw: Gateway, mode: str, tool: str, arguments: dict[str, Any],
               meta: dict[str, Any] | None = None) -> Any:
    """One tool call through the gateway, in a session of its own (as a client restarted)."""
    async with Client(gw.params(), mode=mode) as client:
        return await client.call_tool(tool, arguments, meta=meta)


@pytest.mark.parametrize("mode", REVISIONS)
def test_a_call_repeated_with_new_ids_acts_once_and_the_repeat_reads_the_stored_result(
        ledger_bin: Path, tmp_path: Path, mode: str) -> None:
    gw = gateway(ledger_bin, tmp_path)

    async def main() -> tuple[Any, Any, Any]:
        async with Client(gw.params(), mode=mode) as client:
            first = await client.call_tool("send_email", EMAIL)
            # The same call again: a new request id, as after a broken stream or a retry.
            second = await client.call_tool("send_email", EMAIL)
        # And from a client started anew (a new session, new ids).
        third = await call(gw, mode, "send_email", EMAIL)
        return first, second, third

    first, second, third = anyio.run(main)
    assert len(gw.effects()) == 1, gw.effects()
    assert texts(first) == ["sent #1 to ops@example.com: the weekly report"]
    assert not first.is_error
    for repeat in (second, third):
        assert not repeat.is_error
        assert texts(repeat)[0] == texts(first)[0], "the stored result, as the upstream gave it"
        assert "already performed" in texts(repeat)[-1]
        assert repeat.meta["idempotency-ledger/replayed"] is True
    assert [(tool, status) for tool, status, _ in gw.entries()] == [
        ("counted-upstream/send_email", "SUCCEEDED")]


def test_a_run_named_in_meta_is_its_own_intent(ledger_bin: Path, tmp_path: Path) -> None:
    gw = gateway(ledger_bin, tmp_path)

    async def main() -> None:
        async with Client(gw.params(), mode="2026-07-28") as client:
            for run in ["run-1", "run-1", "run-2"]:
                await client.call_tool("send_email", EMAIL, meta={"idempotency-ledger/run": run})

    anyio.run(main)
    assert len(gw.effects()) == 2, "run-1 once, run-2 once"
    assert sorted(run for _, _, run in gw.entries()) == ["run-1", "run-2"]


def test_an_identical_call_after_the_window_acts_again(ledger_bin: Path, tmp_path: Path) -> None:
    # A window of 3 s: the repeat comes within it even on a loaded machine.
    gw = gateway(ledger_bin, tmp_path, "--same-intent-within", "3s")

    async def main() -> None:
        async with Client(gw.params(), mode="legacy") as client:
            await client.call_tool("send_email", EMAIL)
            await client.call_tool("send_email", EMAIL)  # within the window: a repeat
            await anyio.sleep(3.5)
            await client.call_tool("send_email", EMAIL)  # after a quiet window: a new intent

    anyio.run(main)
    assert len(gw.effects()) == 2
    assert sorted(run for _, _, run in gw.entries()) == ["window-1", "window-2"]


def test_a_read_tool_passes_through_live(ledger_bin: Path, tmp_path: Path) -> None:
    # find_email says it only reads (readOnlyHint): it passes, every call reaching the upstream.
    gw = gateway(ledger_bin, tmp_path)

    async def main() -> list[Any]:
        async with Client(gw.params(), mode="legacy") as client:
            await client.list_tools()
            before = await client.call_tool("find_email", {"subject": "x"})
            await client.call_tool("send_email", {"to": "a@example.com", "subject": "x"})
            after = await client.call_tool("find_email", {"subject": "x"})
            return [before, after]

    before, after = anyio.run(main)
    assert before.structured_content == {"found": False}
    assert after.structured_content == {"found": True}, "read live, never replayed"
    assert len(gw.calls("find_email")) == 2
    assert [tool for tool, _, _ in gw.entries()] == ["counted-upstream/send_email"]


@pytest.mark.parametrize("mode", REVISIONS)
def test_a_call_whose_upstream_died_is_unknown_and_never_sent_again(
        ledger_bin: Path, tmp_path: Path, mode: str) -> None:
    gw = gateway(ledger_bin, tmp_path)

    async def main() -> tuple[Any, Any, Any]:
        async with Client(gw.params(), mode=mode) as client:
            lost = await client.call_tool("send_then_die", EMAIL)
            # The client tries again (a new id); the gateway restarted the upstream meanwhile.
            again = await client.call_tool("send_then_die", EMAIL)
            other = await client.call_tool("send_email", {"to": "b@example.com", "subject": "y"})
            return lost, again, other

    lost, again, other = anyio.run(main)
    assert len(gw.calls("send_then_die")) == 1, "the unknown outcome was never sent again"
    assert len(gw.effects()) == 2, "the lost call's effect, and the other call's"
    for unknown in (lost, again):
        assert unknown.is_error
        assert "unknown" in texts(unknown)[0]
    assert lost.meta["idempotency-ledger/status"] == "UNKNOWN"
    assert not other.is_error, "the restarted upstream serves the next call"
    pids = {c["pid"] for c in gw.calls()}
    assert len(pids) == 2, "the upstream was started again"


def test_an_error_result_is_a_retryable_failure_unless_the_policy_says_final(
        ledger_bin: Path, tmp_path: Path) -> None:
    retried = gateway(ledger_bin, tmp_path / "retried")
    final = gateway(ledger_bin, tmp_path / "final", policy="refuse once errors-final\n")
    for gw in (retried, final):
        gw.directory.mkdir()

    async def twice(gw: Gateway) -> list[Any]:
        async with Client(gw.params(), mode="legacy") as client:
            return [await client.call_tool("refuse", {"reason": "no"}) for _ in range(2)]

    first, second = anyio.run(twice, retried)
    assert first.is_error and second.is_error
    assert len(retried.calls("refuse")) == 2, "nothing happened: the repeat tries again"
    first, second = anyio.run(twice, final)
    assert len(final.calls("refuse")) == 1, "a final failure is not tried again"
    assert second.meta["idempotency-ledger/status"] == "FAILED"
    assert "failed permanently" in texts(second)[0]


def test_concurrent_identical_calls_act_once(ledger_bin: Path, tmp_path: Path) -> None:
    gw = gateway(ledger_bin, tmp_path)
    slow = {"to": "ops@example.com", "subject": "slow", "seconds": 0.5}

    async def main() -> list[Any]:
        results: list[Any] = []
        async with Client(gw.params(), mode="legacy") as client:
            async def one() -> None:
                results.append(await client.call_tool("slow_send", slow))
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one)
        return results

    results = anyio.run(main)
    assert len(gw.effects()) == 1
    assert len(gw.calls("slow_send")) == 1
    assert all(not r.is_error for r in results)
    assert sum(1 for r in results if r.meta and r.meta.get("idempotency-ledger/replayed")) == 7


def test_a_gated_call_awaits_a_person_and_nothing_is_sent(ledger_bin: Path,
                                                           tmp_path: Path) -> None:
    gw = gateway(ledger_bin, tmp_path, policy="send_email gate\n")
    result = anyio.run(call, gw, "legacy", "send_email", EMAIL)
    assert result.is_error
    assert result.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL"
    assert "approval" in texts(result)[0]
    assert gw.calls() == []
    assert [status for _, status, _ in gw.entries()] == ["AWAITING_APPROVAL"]


def test_bad_input_is_refused_with_nothing_stored_or_forwarded(ledger_bin: Path,
                                                                tmp_path: Path) -> None:
    """Raw lines on the gateway's stdin, as a broken client would write them."""
    gw = gateway(ledger_bin, tmp_path)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}
    tool_call = {"jsonrpc": "2.0", "method": "tools/call"}
    lines = [
        json.dumps(init),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        "this is not JSON",
        json.dumps({**tool_call, "id": 1, "params": {"name": "send_email", "arguments": [1]}}),
        json.dumps({**tool_call, "id": 2, "params": {"name": "send_email", "arguments": "{}"}}),
        json.dumps({**tool_call, "id": 3, "params": {"arguments": EMAIL}}),
        json.dumps([{**tool_call, "id": 4, "params": {"name": "send_email", "arguments": EMAIL}}]),
        json.dumps({"jsonrpc": "1.0", "id": 5, "method": "tools/call"}),
        json.dumps({**tool_call, "id": 6, "params": {"name": "send_email", "arguments": {
            "to": "ops@example.com", "subject": "x", "n": 12345678901234567890}}}),
        json.dumps({**tool_call, "id": 7, "params": {"name": "send_email", "arguments": EMAIL}}),
    ]
    process = subprocess.run([str(ledger_bin), *gw.argv()], input="\n".join(lines) + "\n",
                             capture_output=True, text=True, env=gw.env(), timeout=60)
    answers = [json.loads(line) for line in process.stdout.splitlines()]
    by_id = {a.get("id"): a for a in answers}
    errors = [a["error"]["code"] for a in answers if "error" in a]
    assert -32700 in errors, "not JSON: a parse error"
    for refused in (1, 2, 3, 6):
        assert by_id[refused]["error"]["code"] == -32602, by_id[refused]
    assert by_id[5]["error"]["code"] == -32600
    assert any(a.get("id") is None and a["error"]["code"] == -32600 and "batch" in
               a["error"]["message"] for a in answers if "error" in a)
    assert by_id[7]["result"]["content"][0]["text"].startswith("sent #1"), "the gateway lives on"
    assert len(gw.calls("send_email")) == 1, "nothing refused was forwarded"
    assert len(gw.entries()) == 1, "nothing refused was stored"


PAIRED_READ = ("send_then_die confirm find_email subject=/subject found=/found\n"
               "die_once confirm find_email subject=/subject found=/found\n")


def test_a_lost_answer_is_settled_by_the_paired_read_when_the_effect_happened(
        ledger_bin: Path, tmp_path: Path) -> None:
    gw = gateway(ledger_bin, tmp_path, "--confirm-after", "0s", policy=PAIRED_READ)

    async def main() -> tuple[Any, Any]:
        async with Client(gw.params(), mode="legacy") as client:
            lost = await client.call_tool("send_then_die", EMAIL)
            again = await client.call_tool("send_then_die", EMAIL)
            return lost, again

    lost, again = anyio.run(main)
    # Not the tool's own result (that was lost): the note, as an error result that says the
    # action was performed, so that no client checks it against the tool's output schema.
    assert lost.is_error and lost.meta["idempotency-ledger/status"] == "SUCCEEDED"
    assert "was performed" in texts(lost)[0] and "found its effect" in texts(lost)[0]
    assert again.meta["idempotency-ledger/replayed"] is True
    assert "was performed" in texts(again)[0]
    assert len(gw.calls("send_then_die")) == 1 and len(gw.effects()) == 1
    assert len(gw.calls("find_email")) == 1, "read once, settled for good"
    assert [status for _, status, _ in gw.entries()] == ["SUCCEEDED"]


def test_a_lost_answer_whose_effect_did_not_happen_may_act_again(
        ledger_bin: Path, tmp_path: Path) -> None:
    gw = gateway(ledger_bin, tmp_path, "--confirm-after", "0s", policy=PAIRED_READ)

    async def main() -> tuple[Any, Any]:
        async with Client(gw.params(), mode="legacy") as client:
            lost = await client.call_tool("die_once", EMAIL)
            again = await client.call_tool("die_once", EMAIL)
            return lost, again

    lost, again = anyio.run(main)
    assert lost.is_error and "found no trace" in texts(lost)[0]
    assert not again.is_error and texts(again)[0].startswith("sent #1")
    assert len(gw.effects()) == 1, "not done, then done once"


def test_a_pydantic_ai_agent_with_its_own_mcp_client_gets_one_effect_per_intent(
        ledger_bin: Path, tmp_path: Path) -> None:
    """pydantic-ai's MCPToolset (its FastMCP client) pointed at the gateway, no ledger code in
    the agent: the model asks for the same email twice at once, then once more respelled."""
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import (ModelMessage, ModelResponse, TextPart, ToolCallPart,
                                      ToolReturnPart)
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    gw = gateway(ledger_bin, tmp_path)
    respelled = {"subject": EMAIL["subject"], "to": EMAIL["to"]}

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(1 for m in messages if isinstance(m, ModelResponse))
        if turn == 0:
            return ModelResponse(parts=[ToolCallPart("send_email", EMAIL, tool_call_id="c1"),
                                        ToolCallPart("send_email", EMAIL, tool_call_id="c2")])
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("send_email", respelled,
                                                     tool_call_id="c3")])
        return ModelResponse(parts=[TextPart("sent")])

    toolset = MCPToolset(StdioTransport(str(ledger_bin), gw.argv(), env=gw.env()))
    agent = Agent(FunctionModel(respond), toolsets=[toolset])
    result = agent.run_sync("send the weekly report to ops")
    outputs = [str(part.content) for m in result.all_messages() for part in m.parts
               if isinstance(part, ToolReturnPart)]
    assert len(outputs) == 3, outputs
    assert len(gw.effects()) == 1, "three calls of one intent, one email"
    # pydantic-ai gives the model the structured result (the same for the repeats, stored),
    # not the text blocks where the note is: the repeats read as the first did.
    assert outputs == [outputs[0]] * 3, outputs
    assert len(gw.calls("send_email")) == 1


def test_a_gated_call_a_person_decides_acts_once_on_the_repeat_and_a_denied_one_never(
        ledger_bin: Path, tmp_path: Path) -> None:
    """The gateway and a ledger server share PostgreSQL; the person decides with the CLI."""
    from gateway import postgres
    from idempotency_ledger import Ledger
    from idempotency_ledger.testing import LedgerServer

    refund = {"to": "billing@example.com", "subject": "refund 900"}
    with postgres() as database:
        server = LedgerServer(ledger_bin, directory=tmp_path / "server",
                              database_url=database).start()
        try:
            gw = Gateway(ledger_bin, tmp_path, [], "send_email gate\n", database)

            async def twice(arguments: dict[str, str]) -> list[Any]:
                async with Client(gw.params(), mode="legacy") as client:
                    return [await client.call_tool("send_email", arguments)]

            asked = anyio.run(twice, EMAIL)[0]
            other = anyio.run(twice, refund)[0]
            assert asked.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL"
            assert gw.calls() == [], "nothing is sent before a decision"
            with Ledger(server.address) as ledger:
                for result, verdict in [(asked, "approve"), (other, "deny")]:
                    key = result.meta["idempotency-ledger/key"]
                    fingerprint = ledger.lookup(key=key).fingerprint
                    subprocess.run([str(ledger_bin), verdict, key, "--fingerprint", fingerprint,
                                    "--reason", "checked", "--server", server.address],
                                   check=True, capture_output=True)
            approved = anyio.run(twice, EMAIL)[0]
            again = anyio.run(twice, EMAIL)[0]
            denied = anyio.run(twice, refund)[0]
        finally:
            server.stop()
    assert not approved.is_error and texts(approved)[0].startswith("sent #1")
    assert again.meta["idempotency-ledger/replayed"] is True
    assert denied.is_error and denied.meta["idempotency-ledger/status"] == "DENIED"
    assert "checked" in texts(denied)[0], "the person's reason"
    assert len(gw.effects()) == 1, "the approved call once, the denied never"


def asking_person(answer: dict[str, Any] | None, shown: list[str]) -> Any:
    """The person at the client: shown the gateway's form, answers it (``None``: declines)."""
    from mcp import types

    async def person(context: Any, params: Any) -> Any:
        shown.append(params.message)
        if answer is None:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content=answer)
    return person


@pytest.mark.parametrize("mode", REVISIONS)
def test_a_gated_call_asked_at_the_client_acts_once_approved_and_never_denied(
        ledger_bin: Path, tmp_path: Path, mode: str) -> None:
    """``--approvals-at-client``: on 2026-07-28 the gateway's input-required round trip, on the
    session-based revision its own elicitation/create request inside the call."""
    gw = gateway(ledger_bin, tmp_path, "--approvals-at-client", policy="send_email gate\n")
    refund = {"to": "billing@example.com", "subject": "refund 900"}
    shown: list[str] = []

    async def ask(arguments: dict[str, str], answer: dict[str, Any] | None) -> Any:
        async with Client(gw.params(), mode=mode,
                          elicitation_callback=asking_person(answer, shown)) as client:
            return await client.call_tool("send_email", arguments)

    approved = anyio.run(ask, EMAIL, {"approve": True, "reason": "checked"})
    again = anyio.run(ask, EMAIL, {"approve": False})
    denied = anyio.run(ask, refund, {"approve": False, "reason": "wrong customer"})
    declined = anyio.run(ask, {**refund, "subject": "refund 901"}, None)
    assert not approved.is_error and texts(approved)[0].startswith("sent #1"), texts(approved)
    assert again.meta["idempotency-ledger/replayed"] is True, "the repeat replays, not asked"
    assert denied.is_error and denied.meta["idempotency-ledger/status"] == "DENIED"
    assert "wrong customer" in texts(denied)[0], "the person's reason"
    assert declined.meta["idempotency-ledger/status"] == "DENIED"
    assert len(shown) == 3, shown
    assert "ops@example.com" in shown[0] and "send_email" in shown[0], "shown the arguments"
    assert [e["subject"] for e in gw.effects()] == ["the weekly report"], "approved once only"


def test_without_approvals_at_client_the_person_is_not_asked_there(ledger_bin: Path,
                                                                    tmp_path: Path) -> None:
    gw = gateway(ledger_bin, tmp_path, policy="send_email gate\n")
    shown: list[str] = []

    async def ask() -> Any:
        async with Client(gw.params(), mode="legacy",
                          elicitation_callback=asking_person({"approve": True}, shown)) as client:
            return await client.call_tool("send_email", EMAIL)

    awaiting = anyio.run(ask)
    assert awaiting.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL"
    assert shown == [] and gw.calls() == [], "nobody at the client decides; nothing was sent"


def test_a_seal_file_too_short_to_be_secret_stops_the_gateway(ledger_bin: Path,
                                                               tmp_path: Path) -> None:
    seal = tmp_path / "seal"
    seal.write_text("secret\n")
    gw = gateway(ledger_bin, tmp_path, "--approvals-at-client", "--approvals-seal-file", str(seal))
    started = subprocess.run([str(ledger_bin), *gw.argv()], env=gw.env(), input=b"",
                             capture_output=True, timeout=30)
    assert started.returncode != 0
    assert "needs 32 or more secret bytes" in started.stderr.decode(), started.stderr


def test_the_gateway_counts_each_answer_by_tool_on_its_metrics_endpoint(ledger_bin: Path,
                                                                         tmp_path: Path) -> None:
    import httpx
    from gateway import free_port

    port = free_port()
    gw = gateway(ledger_bin, tmp_path, "--metrics-listen", f"127.0.0.1:{port}",
                 policy="send_email once\nrefuse once errors-final\n")

    async def main() -> str:
        async with Client(gw.params(), mode="legacy") as client:
            await client.list_tools()
            for _ in range(2):
                await client.call_tool("send_email", EMAIL)
            await client.call_tool("find_email", {"subject": "x"})
            await client.call_tool("refuse", {"reason": "no"})
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text

    scraped = anyio.run(main)
    series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in scraped.splitlines() if line.startswith("ledger_")}
    tool = "counted-upstream/{}"
    for answer, name, count in [("acted", "send_email", 1), ("replayed", "send_email", 1),
                                ("passed", "find_email", 1), ("failed", "refuse", 1)]:
        labels = f'ledger_mcp_calls_total{{answer="{answer}",tool="{tool.format(name)}"}}'
        assert series.get(labels) == count, (labels, scraped)
    # The ledger's own families count the gateway's entries like any other.
    claims = 'ledger_claims_total{outcome="replayed",tool="counted-upstream/send_email"}'
    assert series.get(claims) == 1, scraped
    assert series.get('ledger_completions_total{status="succeeded"}') == 1, scraped


def test_a_gated_call_decided_in_the_gateways_own_console_acts_once_on_the_repeat(
        ledger_bin: Path, tmp_path: Path) -> None:
    """A desktop user on the embedded store: the gateway serves the ledger's console
    (``--console-listen``); the person approves there; the model's repeat acts once."""
    import re

    import httpx
    from gateway import free_port

    port = free_port()
    gw = gateway(ledger_bin, tmp_path, "--console-listen", f"127.0.0.1:{port}",
                 policy="send_email gate\n")
    console = f"http://127.0.0.1:{port}"

    def field(page: str, name: str) -> str:
        found = re.search(rf'name="{name}" value="([^"]*)"', page)
        assert found, (name, page)
        return found.group(1)

    async def main() -> list[Any]:
        async with Client(gw.params(), mode="legacy") as client:
            asked = await client.call_tool("send_email", EMAIL)
            with httpx.Client(base_url=console, timeout=10) as person:
                page = person.get("/approvals").text
                assert "send_email" in page and "ops@example.com" in page, page
                decided = person.post("/decide", data={
                    "csrf": field(page, "csrf"), "key": field(page, "key"),
                    "fingerprint": field(page, "fingerprint"), "reason": "looks right",
                    "decision": "approve"})
                assert decided.status_code == 303, decided.text
            return [asked, await client.call_tool("send_email", EMAIL),
                    await client.call_tool("send_email", EMAIL)]

    asked, acted, again = anyio.run(main)
    assert asked.meta["idempotency-ledger/status"] == "AWAITING_APPROVAL"
    assert not acted.is_error and texts(acted)[0].startswith("sent #1"), texts(acted)
    assert again.meta["idempotency-ledger/replayed"] is True
    assert len(gw.effects()) == 1
