"""Fixtures: real servers started from the binary ($LEDGER_BIN, else the repository's
target/debug/idempotency-ledger), each on a free port with its own SQLite file."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# The adapters' tests share tests/scenario.py (the scripted conversation, the fake payments API).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import idempotency_ledger.tools
from idempotency_ledger import Ledger
from idempotency_ledger.testing import LedgerServer

REPO = Path(__file__).resolve().parents[3]
TOKENS = {"tenant-a": "token-a", "tenant-b": "token-b"}
#: The approvals server's credentials: the agent's token, and a person's with the approver role.
AGENT_TOKEN = "tok-agent-acme"
APPROVER_TOKEN = "tok-dana-approves"
APPROVER_NAME = "dana@acme.example"
#: Its approval policy: refunds over 100 and every account deletion wait for a person.
APPROVAL_POLICY = "# tenant tool [pointer op bound]\n* issue_refund /amount > 100\n* delete_account\n"


@pytest.fixture(scope="session")
def ledger_bin() -> Path:
    binary = Path(os.environ.get("LEDGER_BIN") or REPO / "target" / "debug" / "idempotency-ledger")
    if not binary.is_file():
        pytest.fail(f"{binary} not found: run `cargo build` or set LEDGER_BIN")
    return binary


def _serve(binary: Path, tmp: Path, **kwargs) -> Iterator[LedgerServer]:
    server = LedgerServer(binary, directory=tmp, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server(ledger_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerServer]:
    """The server most tests share; every test uses its own run ids, so its own keys."""
    yield from _serve(ledger_bin, tmp_path_factory.mktemp("ledger"))


@pytest.fixture(scope="session")
def auth_server(ledger_bin: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerServer]:
    """A server with credentials: tenant-a (token-a) and tenant-b (token-b)."""
    yield from _serve(ledger_bin, tmp_path_factory.mktemp("ledger-auth"), tokens=TOKENS)


@pytest.fixture(scope="session")
def approval_server(ledger_bin: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerServer]:
    """A server with an approval policy (APPROVAL_POLICY), an agent's token and an approver's
    (tenant acme)."""
    yield from _serve(ledger_bin, tmp_path_factory.mktemp("ledger-approvals"),
                      tokens={"acme": AGENT_TOKEN},
                      approvers={APPROVER_TOKEN: ("acme", APPROVER_NAME)},
                      approval_policy=APPROVAL_POLICY)


@pytest.fixture
def agent_ledger(approval_server: LedgerServer) -> Iterator[Ledger]:
    """The agent's client of the approvals server (no approver role)."""
    with Ledger(approval_server.address, token=AGENT_TOKEN, timeout=10) as client:
        yield client


@pytest.fixture
def approver(approval_server: LedgerServer) -> Iterator[Ledger]:
    """The app's approve button: a client with the person's approver token."""
    with Ledger(approval_server.address, token=APPROVER_TOKEN, timeout=10) as client:
        yield client


@pytest.fixture
def fresh_server(ledger_bin: Path, tmp_path: Path) -> Iterator[LedgerServer]:
    """A server of this test's own, for tests that reconcile (Reconcile sees every entry)."""
    yield from _serve(ledger_bin, tmp_path / "ledger")


@pytest.fixture
def ledger(server: LedgerServer) -> Iterator[Ledger]:
    with Ledger(server.address, timeout=10) as client:
        yield client


@pytest.fixture
def run_id() -> str:
    """A run id no other test uses."""
    return f"run-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _missing_run_ids_logged_afresh() -> None:
    """A missing run id is logged once per tool and process: once per test here."""
    idempotency_ledger.tools._missing_logged.clear()


@pytest.fixture(autouse=True)
def _server_log_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Prints the servers' logs after a failed test."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for name in ("server", "auth_server", "fresh_server", "approval_server"):
            if name in request.fixturenames:
                try:
                    log = request.getfixturevalue(name).log()[-4000:]
                except pytest.FixtureLookupError:
                    continue
                except AssertionError:  # a function-scoped server already torn down
                    continue
                print(f"--- {name} log ---\n{log}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
