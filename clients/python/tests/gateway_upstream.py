"""An MCP server whose effects are counted, for the gateway's tests: the upstream the gateway
(``idempotency-ledger mcp``) stands in front of, written with the official Python SDK.

Every call of a tool is appended to the file ``$UPSTREAM_LOG`` (one JSON line: the tool and its
arguments) before the tool does anything else, so the tests count what reached the upstream;
``send_email`` appends its effect to ``$UPSTREAM_EFFECTS`` too. The tools:

- ``send_email(to, subject)``: the effect; answers ``sent #n``.
- ``send_then_die(to, subject)``: the effect, then the process exits before answering (the
  answer is lost: the gateway cannot know the effect happened).
- ``die_once(to, subject)``: the first call exits before doing anything (the answer is lost,
  and nothing happened); later calls send.
- ``find_email(subject)``: read-only (its annotations say so): whether an effect with that
  subject exists (the paired read).
- ``refuse(reason)``: an error result (``isError``), no effect.
- ``slow_send(to, subject, seconds)``: waits, then the effect.

Run with ``python gateway_upstream.py`` (stdio), ``python gateway_upstream.py --http PORT``, or
``--https PORT CERT KEY``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("counted-upstream")


def _log(tool: str, arguments: dict[str, Any]) -> None:
    with Path(os.environ["UPSTREAM_LOG"]).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, "arguments": arguments, "pid": os.getpid()}) + "\n")


def _effect(to: str, subject: str) -> int:
    path = Path(os.environ["UPSTREAM_EFFECTS"])
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"to": to, "subject": subject}) + "\n")
    return len(path.read_text(encoding="utf-8").splitlines())


@server.tool()
def send_email(to: str, subject: str) -> str:
    """Send an email (counted)."""
    _log("send_email", {"to": to, "subject": subject})
    return f"sent #{_effect(to, subject)} to {to}: {subject}"


@server.tool()
def send_then_die(to: str, subject: str) -> str:
    """Send an email, then die before answering."""
    _log("send_then_die", {"to": to, "subject": subject})
    _effect(to, subject)
    sys.stdout.flush()
    os._exit(3)


@server.tool()
def die_once(to: str, subject: str) -> str:
    """The first call dies before acting; later ones send."""
    _log("die_once", {"to": to, "subject": subject})
    marker = Path(os.environ["UPSTREAM_EFFECTS"] + ".died")
    if not marker.exists():
        marker.write_text("died", encoding="utf-8")
        sys.stdout.flush()
        os._exit(4)
    return f"sent #{_effect(to, subject)} to {to}: {subject}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def find_email(subject: str) -> dict[str, Any]:
    """Whether an email with this subject was sent."""
    _log("find_email", {"subject": subject})
    path = Path(os.environ["UPSTREAM_EFFECTS"])
    sent = path.exists() and any(json.loads(line)["subject"] == subject
                                 for line in path.read_text(encoding="utf-8").splitlines())
    return {"found": sent}


@server.tool()
def refuse(reason: str) -> str:
    """Always fails (an error result)."""
    _log("refuse", {"reason": reason})
    raise ValueError(f"refused: {reason}")


@server.tool()
def slow_send(to: str, subject: str, seconds: float) -> str:
    """Wait, then send."""
    _log("slow_send", {"to": to, "subject": subject, "seconds": seconds})
    time.sleep(seconds)
    return f"sent #{_effect(to, subject)} to {to} after {seconds}s"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))  # type: ignore[call-overload]
    elif len(sys.argv) == 5 and sys.argv[1] == "--https":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]),
                    ssl_certfile=sys.argv[3], ssl_keyfile=sys.argv[4], log_level="warning")
    else:
        server.run("stdio")
