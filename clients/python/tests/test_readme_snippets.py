"""Every ```python block of this client's README: each compiles (top-level ``await`` allowed, as
in an asyncio REPL), and each one that can run on its own runs against the real server, with
stand-ins for the names a snippet leaves to the reader (``payments``, ``run_id``, ``args``); the
address a snippet names is the test server's. A block the suite cannot run (the adapters' lines
side by side, each on the app's own model and agent) is listed with why, and a new block must be
one or the other. (test_doc_blocks.py checks every block's imports and names, as written.)"""

from __future__ import annotations

import ast
import asyncio
import io
import re
import uuid
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from idempotency_ledger import (
    AsyncLedger,
    Ledger,
    Reconciler,
    Status,
    derive_key,
    run_scope,
)
from idempotency_ledger.testing import LedgerServer

README = Path(__file__).resolve().parents[1] / "README.md"
ADDRESS = "127.0.0.1:50051"


def python_blocks() -> list[tuple[int, str]]:
    """(line, code) of every ```python block of the README."""
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


BLOCKS = python_blocks()


def compiled(line: int, code: str, address: str = ADDRESS) -> Any:
    return compile(code.replace(ADDRESS, address), f"README.md, the block at line {line}",
                   "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def block(marker: str) -> tuple[int, str]:
    """The one block containing `marker`."""
    (found,) = [(line, code) for line, code in BLOCKS if marker in code]
    return found


class Payments:
    """The payments API the snippets call: ``credit(...)`` and ``find(memo=...)``."""

    def __init__(self) -> None:
        self.credits: dict[str, str] = {}  # memo -> credit id

    def credit(self, customer: str, amount: int, currency: str, memo: str) -> dict:
        credit_id = f"cr-{len(self.credits) + 981}"
        self.credits[memo] = credit_id
        return {"credit_id": credit_id}

    def find(self, memo: str) -> SimpleNamespace | None:
        credit_id = self.credits.get(memo)
        return SimpleNamespace(id=credit_id) if credit_id else None


def run(line: int, code: str, address: str, **names: Any) -> tuple[dict[str, Any], str]:
    """Runs a block (awaiting it if it awaits) with `names` defined; (its names, its output)."""
    namespace: dict[str, Any] = {"__name__": "readme_snippet", **names}
    out = io.StringIO()
    with redirect_stdout(out):
        result = eval(compiled(line, code, address), namespace)  # noqa: S307 (our README)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    return namespace, out.getvalue()


# --- every block compiles, and is run or said why not -------------------------------------------

#: Blocks compiled but not run, by a line of theirs, and why.
COMPILED_ONLY = {
    "# OpenAI Agents SDK: needs_approval asks the ledger":
        "the four frameworks' approval loops side by side, one after the other in one block, "
        "each on the app's own model and gated tool (issue_refund); docs/approvals.md's loops "
        "run as written (test_approvals_guide.py) and examples/approvals.py runs each whole "
        "against a server with an approval policy (test_examples.py)",
    "# pydantic-ai                                  examples/pydantic_ai_agent.py":
        "the four adapters' lines side by side, one after the other in one block, each on the "
        "app's own model and agent; examples/ runs each adapter's agent whole "
        "(test_examples.py)",
}


@pytest.mark.parametrize(("line", "code"), BLOCKS, ids=[f"line-{line}" for line, _ in BLOCKS])
def test_every_python_block_compiles(line: int, code: str) -> None:
    compiled(line, code)


def test_each_block_is_run_or_said_why_not() -> None:
    runners = set(RUNS)
    for line, code in BLOCKS:
        ran = [m for m in runners if m in code]
        skipped = [m for m in COMPILED_ONLY if m in code]
        assert len(ran) + len(skipped) == 1, (
            f"README.md, the block at line {line}: run it in test_readme_snippets.py (RUNS) or "
            "say in COMPILED_ONLY why it cannot run")
    assert len(BLOCKS) == len(RUNS) + len(COMPILED_ONLY)


# --- the blocks that run ------------------------------------------------------------------------


def run_ten_lines(server: LedgerServer) -> None:
    line, code = block('"run-7f3a", "issue_credit", args,')
    payments = Payments()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    code = code.replace('"run-7f3a"', repr(run_id))
    _, first = run(line, code, server.address, payments=payments)
    _, again = run(line, code, server.address, payments=payments)
    assert first == "{'credit_id': 'cr-981'}\n"
    assert again.startswith("{'credit_id': 'cr-981'}\nThis action was already performed")
    assert len(payments.credits) == 1


def run_async_variant(server: LedgerServer) -> None:
    line, code = block("async with AsyncLedger(")
    sent: list[str] = []

    async def send_reply_async(attempt: Any) -> dict:
        sent.append(attempt.external_ref)
        return {"message_id": "msg-1"}

    names, _ = run(line, code, server.address, run_id=f"run-{uuid.uuid4().hex[:8]}",
                   args={"ticket": "t-9", "text": "on its way"},
                   send_reply_async=send_reply_async)
    assert names["result"].value == {"message_id": "msg-1"} and len(sent) == 1


def run_paired_read(server: LedgerServer) -> None:
    line, code = block("def find_credit(attempt: UnknownAttempt):")
    payments = Payments()
    args = {"customer": "c-42", "amount": 200, "currency": "EUR"}

    def issue(attempt: Any) -> dict:
        payments.credit(**args, memo=attempt.external_ref)
        raise TimeoutError("the payments API did not answer")  # the answer is lost

    with Ledger(server.address) as ledger:
        names, _ = run(line, code, server.address, payments=payments, ledger=ledger,
                       run_id=f"run-{uuid.uuid4().hex[:8]}", args=args, issue=issue)
    result = names["result"]
    assert result.confirmed and result.value == {"credit_id": "cr-981"}
    assert result.entry.status == Status.SUCCEEDED


def run_tool_decorator(server: LedgerServer) -> None:
    line, code = block("@ledger.tool(confirm=find_credit)               # under")
    payments = Payments()
    names, _ = run(line, code, server.address, payments=payments)
    try:
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        with run_scope(run_id):
            first = names["issue_credit"]("c-42", 200, "EUR")
            again = names["issue_credit"]("c-42", 200, "EUR")
        assert first == {"credit_id": "cr-981"} and again["status"] == "already_done"
        assert len(payments.credits) == 1
        assert names["issue_credit"].ledger_tool.confirm is names["find_credit"]
    finally:
        names["ledger"].close()


def run_reconciler(server: LedgerServer) -> None:
    line, code = block("reconciler = Reconciler(ledger, [issue_credit, send_reply]).start()")
    with Ledger(server.address) as ledger:
        @ledger.tool(run_id="r", confirm=lambda attempt: None)
        def issue_credit(customer: str) -> dict:
            return {}

        @ledger.tool(run_id="r", confirm=lambda attempt: None)
        def send_reply(ticket: str) -> dict:
            return {}

        names, _ = run(line, code, server.address, ledger=ledger, issue_credit=issue_credit,
                       send_reply=send_reply)
    reconciler = names["reconciler"]
    assert isinstance(reconciler, Reconciler) and not reconciler._thread.is_alive()  # noqa: SLF001
    assert list(reconciler.tools) == ["issue_credit", "send_reply"]


def run_list_entries(server: LedgerServer) -> None:
    line, code = block("for entry in ledger.list_entries(")
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    code = code.replace('"run-7f3a"', repr(run_id))

    async def main() -> str:
        with Ledger(server.address) as ledger:
            ledger.run_once(run_id, "issue_credit", {"customer": "c-1"}, lambda a: {"ok": 1})
            async with AsyncLedger(server.address) as async_ledger:
                namespace = {"ledger": ledger, "async_ledger": async_ledger}
                out = io.StringIO()
                with redirect_stdout(out):
                    await eval(compiled(line, code, server.address), namespace)  # noqa: S307
        return out.getvalue()

    printed = asyncio.run(main())
    assert " issue_credit SUCCEEDED {\"customer\":\"c-1\"}\n" in printed


def run_errors(server: LedgerServer) -> None:
    line, code = block("except InvalidArgument as e:")
    code = code.replace("    e.reason, e.field", "    seen = (e.reason, e.field)")
    with Ledger(server.address) as ledger:
        names, _ = run(line, code, server.address, ledger=ledger,
                       run_id=f"run-{uuid.uuid4().hex[:8]}")
    assert names["seen"] == ("DUPLICATE_MEMBER", "arguments_json")  # as the comment says


def run_keys(server: LedgerServer) -> None:
    line, code = block("derive_key(\"run-7f3a\"")
    names, _ = run(line, code, server.address)
    expected = re.search(r"# '([0-9a-f]{64})'", code)
    assert expected is not None
    args = {"customer": "c-42", "amount": 200, "currency": "EUR"}
    assert names["derive_key"] is derive_key
    assert derive_key("run-7f3a", "issue_credit", args) == expected.group(1)
    with Ledger(server.address) as ledger:  # as the server derives it
        claimed = ledger.claim("run-7f3a", "issue_credit", args)
        ledger.complete(claimed.key, claimed.claim_token, Status.SUCCEEDED, result=b"{}")
    assert claimed.key == expected.group(1)


def run_fenced_resolutions(server: LedgerServer) -> None:
    line, code = block("for pending in ledger.reconcile(")
    code = code.replace("older_than=60", "older_than=0")  # entries made just now
    payments = Payments()
    with LedgerServer() as own, Ledger(own.address) as ledger:  # Reconcile sees every entry
        keys = []
        for customer in ("c-1", "c-2"):
            claimed = ledger.claim("run-1", "issue_credit", {"customer": customer})
            ledger.complete(claimed.key, claimed.claim_token, Status.UNKNOWN, error="lost")
            keys.append(claimed.key)
        payments.credit("c-1", 1, "EUR", memo=ledger.lookup(keys[0]).external_ref)
        _, printed = run(line, code, own.address, ledger=ledger, payments=payments)
        assert printed == ""  # both findings applied
        first, second = (ledger.lookup(k) for k in keys)
    assert (first.status, first.result) == (Status.SUCCEEDED, b'{"credit_id": "cr-981"}')
    assert (second.status, second.retryable) == (Status.FAILED, True)


def run_approvals(server: LedgerServer) -> None:
    line, code = block('asked = ledger.claim(run_id, "issue_refund"')
    with LedgerServer(server.binary, tokens={"acme": "tok-agent"},
                      approvers={"tok-dana": ("acme", "dana")},
                      approval_policy="* issue_refund /amount > 100\n") as own, \
            Ledger(own.address, token="tok-agent") as ledger, \
            Ledger(own.address, token="tok-dana") as approver:
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        names, _ = run(line, code, own.address, ledger=ledger, approver=approver, run_id=run_id)
        assert names["entry"].approval.decided_by == "dana"
        assert names["result"].value == {"refund_id": "rf-1"} and not names["result"].replayed


#: The blocks run, by a line of theirs.
RUNS: dict[str, Callable[[LedgerServer], None]] = {
    '"run-7f3a", "issue_credit", args,': run_ten_lines,
    "async with AsyncLedger(": run_async_variant,
    "def find_credit(attempt: UnknownAttempt):": run_paired_read,
    "@ledger.tool(confirm=find_credit)               # under": run_tool_decorator,
    "reconciler = Reconciler(ledger, [issue_credit, send_reply]).start()": run_reconciler,
    "for entry in ledger.list_entries(": run_list_entries,
    "except InvalidArgument as e:": run_errors,
    'derive_key("run-7f3a"': run_keys,
    "for pending in ledger.reconcile(": run_fenced_resolutions,
    'asked = ledger.claim(run_id, "issue_refund"': run_approvals,
}


@pytest.mark.parametrize("marker", list(RUNS), ids=[f.__name__ for f in RUNS.values()])
def test_the_block_runs(server: LedgerServer, marker: str) -> None:
    RUNS[marker](server)
