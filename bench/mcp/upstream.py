"""The benchmark's upstream MCP server: one tool, ``act(n)``, that does nothing but answer, so
that what the benchmark measures is the path through the gateway, not a tool's work. Stdio by
default; ``--http PORT`` for Streamable HTTP (stateless: no session to keep)."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-upstream")


@server.tool()
def act(n: int) -> str:
    """Answer at once."""
    return f"done {n}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))  # type: ignore[call-overload]
    else:
        server.run("stdio")
