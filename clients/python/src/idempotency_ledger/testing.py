"""Starts a real ``idempotency-ledger`` server for tests: a free port, its own SQLite file (or
the PostgreSQL database you name).

    with LedgerServer() as server:
        with Ledger(server.address) as ledger:
            ...

The binary is ``binary=``, else ``$LEDGER_BIN``, else ``idempotency-ledger`` on ``PATH``, else
``target/debug/idempotency-ledger`` or ``target/release/idempotency-ledger`` in the current
directory or the nearest one above it that has either (the more recently built of the two when
both are there).

A test server hands unknown outcomes to ``Reconcile`` at once: it is started with
``--reconcile-grace 0s`` (the server's own default is 10 s, so that an action still landing is
seen by the read) unless ``reconcile_grace=`` or the `args` say otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["LedgerServer", "find_binary"]

_LISTEN = re.compile(r"starting listen=(\S+)")
_READY = "store reachable"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def find_binary() -> Path:
    """The server binary to run (see the module's documentation)."""
    if os.environ.get("LEDGER_BIN"):
        return Path(os.environ["LEDGER_BIN"])
    on_path = shutil.which("idempotency-ledger")
    if on_path:
        return Path(on_path)
    here = Path.cwd().resolve()
    for directory in (here, *here.parents):
        builds = [directory / "target" / profile / "idempotency-ledger"
                  for profile in ("debug", "release")]
        found = [b for b in builds if b.is_file()]
        if found:
            # The newer build is the one that matches the sources a developer just changed.
            return max(found, key=lambda b: b.stat().st_mtime)
    raise FileNotFoundError("idempotency-ledger not found: set LEDGER_BIN, or build it "
                            "(`cargo build` or `cargo build --release`)")


class LedgerServer:
    """One server process on 127.0.0.1 and a free port, with a fresh SQLite file.

    Args:
        binary: the server binary (see :func:`find_binary`).
        tokens: tenant → token; written to a tokens file and passed as ``--auth-tokens-file``.
        approvers: token → (tenant, name): credentials with the approver role (the tokens
            file's third column, ``approver=NAME``; an empty name writes ``approver``), who may
            decide about calls awaiting approval. They go in the same tokens file.
        approval_policy: the text of an ``--approval-policy`` file (one rule a line, as
            ``* issue_refund /amount > 100``), written beside the database.
        args: more flags, such as ``["--default-lease", "2s"]``.
        directory: where the database, tokens file and log go (a temporary directory otherwise,
            removed on stop).
        database_url: the store, such as ``postgres://user@host:5432/db`` (default: a fresh
            SQLite file in `directory`).
        env: more environment variables for the server, such as ``{"RUST_LOG": "debug"}``
            (default ``RUST_LOG=info``).
        reconcile_grace: ``--reconcile-grace``, how long an outcome stays unknown before
            Reconcile hands it out: ``"0s"`` by default, so that tests reconcile at once;
            ``None`` leaves the server's default (10 s). A ``--reconcile-grace`` in `args`
            wins.
        startup_timeout: seconds to wait for the server to serve.
    """

    def __init__(
        self,
        binary: str | Path | None = None,
        *,
        tokens: Mapping[str, str] | None = None,
        approvers: Mapping[str, tuple[str, str]] | None = None,
        approval_policy: str | None = None,
        args: Sequence[str] = (),
        directory: str | Path | None = None,
        database_url: str | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        reconcile_grace: str | None = "0s",
    ) -> None:
        self.binary = Path(binary) if binary else find_binary()
        self.tokens = dict(tokens or {})
        self.approvers = dict(approvers or {})
        self.approval_policy = approval_policy
        self.args = list(args)
        self.reconcile_grace = reconcile_grace
        self.startup_timeout = startup_timeout
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="ledger-"))
        self.database = self.directory / "ledger.db"
        self.database_url = database_url or f"sqlite://{self.database}"
        self.env = dict(env or {})
        self.log_path = self.directory / "server.log"
        self.address = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        """The server process's id (to pause it with SIGSTOP in a test: a server that cannot
        answer, deterministically)."""
        if self._process is None:
            raise RuntimeError("the server is not running")
        return self._process.pid

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        try:
            return _ANSI.sub("", self.log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return ""

    def start(self) -> LedgerServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = [str(self.binary), "--listen", "127.0.0.1:0",
                   "--database-url", self.database_url]
        if self.tokens or self.approvers:
            tokens_file = self.directory / "tokens"
            tokens_file.write_text(
                "".join(f"{t} {k}\n" for t, k in self.tokens.items())
                + "".join(f"{tenant} {token} approver{'=' + name if name else ''}\n"
                          for token, (tenant, name) in self.approvers.items()))
            command += ["--auth-tokens-file", str(tokens_file)]
        if self.approval_policy is not None:
            policy_file = self.directory / "approval-policy"
            policy_file.write_text(self.approval_policy)
            command += ["--approval-policy", str(policy_file)]
        grace_given = any(a == "--reconcile-grace" or a.startswith("--reconcile-grace=")
                          for a in self.args)
        if self.reconcile_grace is not None and not grace_given:
            command += ["--reconcile-grace", self.reconcile_grace]
        command += self.args
        env = {**os.environ, "RUST_LOG": "info", "NO_COLOR": "1", **self.env}
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=log, env=env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = self.log()
            listen = _LISTEN.search(text)
            if listen and _READY in text:
                self.address = listen.group(1)
                return self
            if self._process.poll() is not None:
                break
            time.sleep(0.02)
        log = self.log()  # before stop() removes a directory of our own
        self.stop()
        raise RuntimeError(f"the ledger did not start ({' '.join(command)}):\n{log}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> LedgerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
