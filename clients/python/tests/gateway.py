"""The gateway's test harness: ``idempotency-ledger mcp`` in front of the counted upstream
(``gateway_upstream.py``), as an MCP client's configuration would start it, with the upstream's
log and effects in files the tests read."""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from mcp import StdioServerParameters

UPSTREAM = Path(__file__).resolve().parent / "gateway_upstream.py"


@dataclass
class Gateway:
    """One gateway's command line and the files its upstream writes."""

    binary: Path
    directory: Path
    flags: list[str] = field(default_factory=list)
    policy: str | None = None
    #: The ledger's store; the directory's SQLite file by default.
    database_url: str | None = None
    #: A ledger server instead of a store: its URL and the token the gateway calls it with.
    ledger: tuple[str, str] | None = None

    @property
    def database(self) -> Path:
        return self.directory / "ledger.db"

    def argv(self) -> list[str]:
        """The gateway's arguments: its store, its flags, then the upstream after ``--``."""
        args = ["mcp", *self.store(), *self.flags]
        if self.policy is not None:
            policy = self.directory / "policy"
            policy.write_text(self.policy, encoding="utf-8")
            args += ["--mcp-policy", str(policy)]
        return [*args, "--", sys.executable, str(UPSTREAM)]

    def store(self, database_url: str | None = None) -> list[str]:
        """Where the gateway claims its calls: the ledger server, else its own store."""
        if self.ledger is not None:
            return ["--ledger", self.ledger[0], "--ledger-token", self.ledger[1]]
        return ["--database-url", database_url or self.database_url or f"sqlite://{self.database}"]

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
        """The ledger's entries: (tool, status, run_id), oldest first; a window's run as
        `intent_of` shows it."""
        if not self.database.exists():
            return []
        with sqlite3.connect(self.database) as db:
            return [(tool, status, intent_of(run)) for tool, status, run in db.execute(
                "SELECT tool, status, run_id FROM ledger_entries ORDER BY started_at")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


@contextmanager
def http_upstream(gw: Gateway, tls: tuple[Path, Path] | None = None) -> Iterator[str]:
    """The counted upstream over Streamable HTTP (over TLS with ``tls``, its certificate and
    key files); its endpoint's URL."""
    port = free_port()
    mode = ["--https", str(port), str(tls[0]), str(tls[1])] if tls else ["--http", str(port)]
    process = subprocess.Popen([sys.executable, str(UPSTREAM), *mode],
                               env=gw.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, "the upstream")
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=10)


@contextmanager
def http_gateway(gw: Gateway, upstream: str, *flags: str,
                 database_url: str | None = None) -> Iterator[str]:
    """One gateway replica over Streamable HTTP in front of `upstream`; its endpoint's URL."""
    port = free_port()
    args = ["mcp", *gw.store(database_url),
            "--listen", f"127.0.0.1:{port}", "--upstream", upstream, *gw.flags, *flags]
    if gw.policy is not None:
        policy = gw.directory / "policy"
        policy.write_text(gw.policy, encoding="utf-8")
        args += ["--mcp-policy", str(policy)]
    process = subprocess.Popen([str(gw.binary), *args], env=gw.env())
    try:
        wait_for_port(port, process, "the gateway")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=20)


def identical_calls_over_two(first: str, second: str, calls: int,
                             arguments: dict[str, Any]) -> list[Any]:
    """`calls` identical `slow_send` calls at once, alternating between two gateway replicas,
    one client on 2026-07-28 and one on the session-based handshake; their results."""
    import anyio
    from mcp import Client

    async def main() -> list[Any]:
        results: list[Any] = []
        async with Client(first, mode="2026-07-28") as one, \
                Client(second, mode="legacy") as two:
            async def call(client: Client) -> None:
                results.append(await client.call_tool("slow_send", arguments))
            async with anyio.create_task_group() as tg:
                for n in range(calls):
                    tg.start_soon(call, one if n % 2 else two)
        return results

    return anyio.run(main)


#: The stateless revision's `_meta` a raw request carries to be one (the upstream refuses it
#: otherwise, asking for a session).
STATELESS_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}


def tool_call(id: int, name: str | None, arguments: Any) -> dict[str, Any]:
    """A raw `tools/call` of the stateless revision."""
    params: dict[str, Any] = {"arguments": arguments, "_meta": STATELESS_META}
    if name is not None:
        params["name"] = name
    return {"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}


@contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster on a free port; its URL. As root (CI), it runs as the
    `postgres` user, which PostgreSQL requires, in a directory of its own."""
    import glob
    import pwd
    import shutil
    import tempfile

    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    path = os.pathsep.join([*bins, os.environ.get("PATH", "")])
    initdb = shutil.which("initdb", path=path)
    pg_ctl = shutil.which("pg_ctl", path=path)
    if initdb is None or pg_ctl is None:
        raise RuntimeError("PostgreSQL's initdb and pg_ctl are needed (Debian's postgresql-15)")
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    home = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    home.chmod(0o755)
    if as_root:
        user = pwd.getpwnam("postgres")
        os.chown(home, user.pw_uid, user.pw_gid)
    data, port = home / "data", free_port()
    subprocess.run([*prefix, initdb, "-D", str(data), "-U", "postgres", "--auth=trust",
                    "-E", "UTF8"], check=True, capture_output=True)
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run([*prefix, pg_ctl, "-D", str(data), "-o", options, "-l", str(home / "log"),
                    "-w", "start"], check=True, capture_output=True)
    try:
        yield f"postgres://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def post(url: str, body: bytes | str, headers: dict[str, str] | None = None) -> httpx.Response:
    """One raw POST, as a broken or hostile client would send it (the stateless revision's
    headers; a tool call's name as Mcp-Name when the body has one)."""
    name = ""
    try:
        name = json.loads(body)["params"]["name"]
    except (ValueError, KeyError, TypeError):
        pass
    return httpx.post(url, content=body, timeout=20, headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": name,
        **(headers or {})})


def texts(result: Any) -> list[str]:
    """The text blocks of a CallToolResult."""
    return [block.text for block in result.content if getattr(block, "text", None) is not None]


def certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate it signed for 127.0.0.1: the CA's PEM file, the
    certificate's and its key's."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    week = datetime.timedelta(days=7)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test CA")).issuer_name(name("test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - week).not_valid_after(now + week)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - week).not_valid_after(now + week)
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    files = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return files


def intent_of(run: str) -> str:
    """A window's run `window-<call>-<n>` as `window-<n>`, after checking its form: each call's
    intents are runs of their own (`<call>` is 16 hex digits of its fingerprint); any other
    run as it is."""
    match = re.fullmatch(r"window-([0-9a-f]{16})-([0-9]+)", run)
    if run.startswith("window-"):
        assert match, f"a window's run is window-<call>-<n>: {run}"
    return f"window-{match.group(2)}" if match else run
