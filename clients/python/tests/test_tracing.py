"""The caller's OpenTelemetry span reaches the ledger as ``traceparent``: the real
opentelemetry-sdk makes the span, the real server logs the trace it received. Without
opentelemetry-api installed the client sends nothing and needs nothing."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from idempotency_ledger import AsyncLedger, Ledger
from idempotency_ledger.testing import LedgerServer

# Not the global provider (it can be set once per process): a tracer of the test's own, whose
# spans become the current context all the same.
TRACER = TracerProvider().get_tracer(__name__)


@pytest.fixture(scope="module")
def logged_server(ledger_bin: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A server that logs every call with the trace it carried (DEBUG access lines)."""
    server = LedgerServer(ledger_bin, directory=tmp_path_factory.mktemp("ledger-traced"),
                          env={"RUST_LOG": "info,idempotency_ledger=debug"}).start()
    try:
        yield server
    finally:
        server.stop()


def calls(server: LedgerServer, rpc: str, key_prefix: str) -> list[str]:
    """The server's access lines of `rpc` calls on the key starting with `key_prefix`."""
    return [line for line in server.log().splitlines()
            if "call finished" in line and f'rpc="{rpc}"' in line
            and f'key="{key_prefix[:12]}' in line]


def ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def test_the_current_span_is_the_parent_of_the_ledgers_calls(logged_server: LedgerServer,
                                                             run_id: str) -> None:
    with Ledger(logged_server.address) as ledger:
        with TRACER.start_as_current_span("tool issue_credit") as span:
            result = ledger.run_once(run_id, "issue_credit", {"n": 1}, lambda a: {"ok": True})
        trace_id, span_id = ids(span)
        key = result.entry.key
        for rpc in ("Claim", "Complete"):
            (line,) = calls(logged_server, rpc, key)
            assert f'trace_id="{trace_id}"' in line and f'parent_span_id="{span_id}"' in line
        # Outside any span nothing is sent: the call carries no trace.
        entry = ledger.lookup(key)
        assert entry.key == key
        (untraced,) = calls(logged_server, "Lookup", key)
        assert "trace_id=" not in untraced


def test_the_asyncio_client_sends_the_span_too(logged_server: LedgerServer,
                                               run_id: str) -> None:
    async def main() -> tuple[str, str, str]:
        async with AsyncLedger(logged_server.address) as ledger:
            with TRACER.start_as_current_span("tool send_reply") as span:
                claimed = await ledger.claim(run_id, "send_reply", {})
            return (*ids(span), claimed.key)

    trace_id, span_id, key = asyncio.run(main())
    (line,) = calls(logged_server, "Claim", key)
    assert re.search(rf'trace_id="{trace_id}".*parent_span_id="{span_id}"', line)


def test_without_opentelemetry_nothing_is_sent_and_nothing_is_needed() -> None:
    # A Python in which `import opentelemetry` fails, as where the package is not installed.
    code = ("import sys; sys.modules['opentelemetry'] = None\n"
            "import idempotency_ledger, idempotency_ledger._trace as t\n"
            "assert t.propagate is None and t.trace_metadata() == (), t.trace_metadata()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
