"""The gateway's test harness: ``idempotency-ledger mcp`` in front of the counted upstream
(``gateway_upstream.py``), as an MCP client's configuration would start it, with the upstream's
log and effects in files the tests read."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters

UPSTREAM = Path(__file__).resolve().parent / "gateway_upstream.py"


@dataclass
class Gateway:
    """One gateway's command line and the files its upstream writes."""

    binary: Path
    directory: Path
    flags: list[str] = field(default_factory=list)
    policy: str | None = None

    @property
    def database(self) -> Path:
        return self.directory / "ledger.db"

    def argv(self) -> list[str]:
        """The gateway's arguments: its store, its flags, then the upstream after ``--``."""
        args = ["mcp", "--database-url", f"sqlite://{self.database}", *self.flags]
        if self.policy is not None:
            policy = self.directory / "policy"
            policy.write_text(self.policy, encoding="utf-8")
            args += ["--mcp-policy", str(policy)]
        return [*args, "--", sys.executable, str(UPSTREAM)]

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "UPSTREAM_LOG": str(self.directory / "calls"),
            "UPSTREAM_EFFECTS": str(self.directory / "effects"),
            "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
        }

    def params(self) -> StdioServerParameters:
        """What an MCP client starts: the gateway, which starts the upstream."""
        return StdioServerParameters(command=str(self.binary), args=self.argv(), env=self.env())

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """Every call that reached the upstream (of `tool`), in order."""
        path = self.directory / "calls"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        calls = [json.loads(line) for line in lines]
        return [c for c in calls if tool is None or c["tool"] == tool]

    def effects(self) -> list[dict[str, Any]]:
        """Every email the upstream sent."""
        path = self.directory / "effects"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        return [json.loads(line) for line in lines]

    def entries(self) -> list[tuple[str, str, str]]:
        """The ledger's entries: (tool, status, run_id), oldest first."""
        if not self.database.exists():
            return []
        with sqlite3.connect(self.database) as db:
            return list(db.execute(
                "SELECT tool, status, run_id FROM ledger_entries ORDER BY started_at"))


def texts(result: Any) -> list[str]:
    """The text blocks of a CallToolResult."""
    return [block.text for block in result.content if getattr(block, "text", None) is not None]
