"""The examples against a real server: the dispatcher and the reconciler, run as the programs
they are, and the agent of each framework adapter, its main() run in this process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from idempotency_ledger import Ledger, Status
from idempotency_ledger.testing import LedgerServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CREDIT = {"customer": "c-42", "amount": 200, "currency": "EUR"}
CREDIT_REORDERED = '{"currency":"EUR","amount":2e2,"customer":"c-42"}'


class Agent:
    """Runs the example programs against one server and one example world."""

    def __init__(self, server: LedgerServer, world: Path) -> None:
        self.server = server
        self.world = world

    def _run(self, script: str, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / script), "--target", self.server.address,
             "--world", str(self.world), *args],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def call(self, run_id: str, tool: str, arguments: object, fault: str | None = None) -> dict:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        extra = ["--fault", fault] if fault else []
        return json.loads(self._run("dispatcher.py", "--run-id", run_id, *extra, tool, text))

    def reconcile(self) -> list[dict]:
        out = self._run("reconciler.py", "--older-than", "0")
        return [json.loads(line) for line in out.splitlines()]

    def credits(self) -> list[dict]:
        return json.loads(self.world.read_text())["credits"] if self.world.exists() else []


@pytest.fixture
def agent(fresh_server: LedgerServer, tmp_path: Path) -> Agent:
    return Agent(fresh_server, tmp_path / "world.json")


def test_the_dispatcher_issues_a_credit_once_and_tells_the_model_on_repeat(agent: Agent) -> None:
    first = agent.call("run-1", "issue_credit", CREDIT)
    assert first == {"ok": True, "replayed": False,
                     "result": {"credit_id": "cr-001", "amount": 200, "currency": "EUR"}}
    again = agent.call("run-1", "issue_credit", CREDIT_REORDERED)
    assert again["ok"] and again["replayed"] and again["result"] == first["result"]
    assert again["note"].startswith("This action was already performed in this run")
    assert len(agent.credits()) == 1
    # A person asking again in a new run is a new intent.
    assert not agent.call("run-2", "issue_credit", CREDIT)["replayed"]
    assert len(agent.credits()) == 2


def test_the_dispatcher_sends_a_reply_once(agent: Agent) -> None:
    reply = {"ticket": "t-9", "text": "Your credit is on its way."}
    assert agent.call("run-1", "send_reply", reply)["result"] == {"message_id": "msg-001"}
    assert agent.call("run-1", "send_reply", reply)["replayed"]
    assert len(json.loads(agent.world.read_text())["replies"]) == 1


def test_failures_reach_the_model_as_such(agent: Agent) -> None:
    limited = agent.call("run-1", "issue_credit", CREDIT, fault="rate-limited")
    assert limited == {"ok": False, "retryable": True,
                       "error": "429: too many requests, nothing was done"}
    assert agent.call("run-1", "issue_credit", CREDIT)["result"]["credit_id"] == "cr-001"

    unknown_customer = {**CREDIT, "customer": "c-404"}
    refused = agent.call("run-1", "issue_credit", unknown_customer)
    assert refused["ok"] is False and refused["retryable"] is False
    previously = agent.call("run-1", "issue_credit", unknown_customer)
    # The note quotes the stored error, once; nothing repeats it beside.
    assert previously == {"ok": False, "note": previously["note"]}
    assert previously["note"].count("PermanentFailure: customer c-404 does not exist") == 1
    assert len(agent.credits()) == 1


def test_the_reconciler_resolves_what_timeouts_left_unknown(agent: Agent) -> None:
    # The API credited, then the answer was lost: the ledger does not know.
    lost_answer = agent.call("run-1", "issue_credit", CREDIT, fault="timeout-after-effect")
    assert lost_answer["status"] == "unknown"
    # The request never arrived: the ledger does not know either.
    lost_request = agent.call("run-2", "issue_credit", CREDIT, fault="timeout-before-effect")
    assert lost_request["status"] == "unknown"
    assert len(agent.credits()) == 1
    # Until reconciled, repeats are not executed.
    assert agent.call("run-1", "issue_credit", CREDIT)["status"] == "unknown"
    with Ledger(agent.server.address) as ledger:
        entry = ledger.lookup(run_id="run-1", tool="issue_credit", arguments=CREDIT)
        assert entry.status == Status.UNKNOWN

    resolved = {r["key"]: r for r in agent.reconcile()}
    assert len(resolved) == 2
    found = resolved[entry.key]
    assert (found["outcome"], found["status"], found["tool"]) == ("found", "SUCCEEDED",
                                                                  "issue_credit")
    (not_found,) = (r for k, r in resolved.items() if k != entry.key)
    assert (not_found["outcome"], not_found["status"]) == ("not_found", "FAILED")
    with Ledger(agent.server.address) as ledger:
        settled = ledger.lookup(entry.key)
        assert json.loads(settled.result) == {"credit_id": "cr-001", "amount": 200,
                                              "currency": "EUR"}
        assert settled.resolved_by == found["who"] and found["who"].startswith("reconciler@")
        assert ledger.lookup(not_found["key"]).retryable
    assert agent.reconcile() == []  # nothing left

    # The credit that happened is replayed; the one that did not runs now, once.
    replay = agent.call("run-1", "issue_credit", CREDIT_REORDERED)
    assert replay["replayed"] and replay["result"]["credit_id"] == "cr-001"
    retried = agent.call("run-2", "issue_credit", CREDIT)
    assert not retried["replayed"] and retried["result"]["credit_id"] == "cr-002"
    assert len(agent.credits()) == 2


# --- the agents inside frameworks: one per adapter ------------------------------------------

REPLAYED = "This action was already performed in this run"


def load_example(script: str) -> Any:
    """Imports an example as a module; examples/ must be on sys.path (the examples import
    world.py beside them)."""
    spec = importlib.util.spec_from_file_location(f"example_{script[:-3]}", EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_agent(server: LedgerServer, world: Path, script: str, run_id: str,
              capsys: pytest.CaptureFixture[str]) -> list[dict]:
    """Runs the example's main() in this process (the frameworks are imported once for the
    whole suite, where a program would import them anew each time: seconds a run)."""
    sys.path.insert(0, str(EXAMPLES))  # the examples import world.py beside them
    try:
        module = load_example(script)
        capsys.readouterr()
        assert module.main(["--target", server.address, "--world", str(world),
                            "--run-id", run_id]) == 0
    finally:
        sys.path.remove(str(EXAMPLES))
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("script", ["pydantic_ai_agent.py", "openai_agents_agent.py",
                                    "langchain_agent.py", "mcp_server.py"])
def test_each_framework_agent_acts_once_per_run(fresh_server: LedgerServer, tmp_path: Path,
                                                script: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    world = tmp_path / "world.json"
    first = run_agent(fresh_server, world, script, "run-1", capsys)
    credits = [r for r in first if r["tool"] == "issue_credit"]
    assert len(credits) == 3
    assert sum(REPLAYED in json.dumps(r["read"]) for r in credits) == 2
    state = json.loads(world.read_text())
    assert len(state["credits"]) == 1 and len(state["replies"]) == 1
    # The same run again (a runtime retrying it): every call is a replay, nothing new happens.
    again = run_agent(fresh_server, world, script, "run-1", capsys)
    assert all(REPLAYED in json.dumps(r["read"]) for r in again)
    assert json.loads(world.read_text()) == state
    # Another run is a new intent: the credit is issued again.
    run_agent(fresh_server, world, script, "run-2", capsys)
    assert len(json.loads(world.read_text())["credits"]) == 2


def test_the_approvals_example_acts_once_per_approved_call_of_a_step_in_each_framework(
        approval_server: LedgerServer, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import AGENT_TOKEN, APPROVER_TOKEN

    module = load_example("approvals.py")
    capsys.readouterr()
    assert module.main(["--target", approval_server.address, "--agent-token", AGENT_TOKEN,
                        "--approver-token", APPROVER_TOKEN,
                        "--run-id", f"run-{uuid.uuid4().hex[:8]}"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["framework"] for line in lines] == ["openai_agents", "pydantic_ai",
                                                     "langchain", "mcp"]
    for line in lines:
        # Two gated calls in one step: the approved one acted once, the denied one never, and
        # the model read the person's reason for it.
        assert line["refunds"] == 1, line
        reads = [json.dumps(read) for read in line["model_read"]]
        (refunded,) = [read for read in reads if "rf-001" in read]
        (declined,) = [read for read in reads if "denied" in read]
        assert len(reads) == 2 and "o-1001" in refunded, line
        assert "o-1002 was refunded by hand already" in declined, line


# --- the programs' own help --------------------------------------------------------------------

# The programs; world.py and reads.py are modules the others import.
PROGRAMS = sorted(p.name for p in EXAMPLES.glob("*.py")
                  if p.name not in ("world.py", "reads.py"))


@pytest.mark.parametrize("script", PROGRAMS)
def test_each_example_says_what_it_is_in_whole_sentences_in_its_help(
        script: str, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        module = load_example(script)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            module.main(["--help"])
    finally:
        sys.path.remove(str(EXAMPLES))
    assert exited.value.code == 0
    # The docstring's first paragraph, whole (argparse rewraps it, so compare without spaces).
    summary = module.__doc__.split("\n\n", 1)[0]
    assert summary.rstrip().endswith("."), summary
    assert "".join(summary.split()) in "".join(capsys.readouterr().out.split())
