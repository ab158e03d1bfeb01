"""Real faults for the failover tests: a throwaway PostgreSQL cluster the test starts, stops
and restarts (initdb and pg_ctl, as the ``postgres`` OS user when the tests run as root, as CI
does), and a TCP proxy whose connections the test cuts."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
max_connections = 100
shared_buffers = 16MB
fsync = off
full_page_writes = off
"""


def _postgres_bin() -> Path | None:
    found = [d for d in Path("/usr/lib/postgresql").glob("*/bin") if (d / "initdb").is_file()]
    if found:
        return max(found, key=lambda d: int(d.parent.name))
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Postgres:
    """One PostgreSQL cluster in a temporary directory, on a free port, trusting 127.0.0.1 (no
    password). ``url`` is the server's ``--database-url``."""

    def __init__(self) -> None:
        bin_dir = _postgres_bin()
        if bin_dir is None:
            pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
        self.bin = bin_dir
        self.as_root = os.geteuid() == 0
        self.directory = Path(tempfile.mkdtemp(prefix="ledger-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "postgres.log"
        self.port = free_port()
        if self.as_root:  # PostgreSQL refuses to run as root: hand it the directory
            shutil.chown(self.directory, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(_CONF.format(port=self.port, sockets=self.directory))

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres?sslmode=disable"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if self.as_root:
            command = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
                       *command]
        done = subprocess.run(command, cwd=self.directory, capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> Postgres:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "start")
        return self

    def stop(self, mode: str = "immediate") -> None:
        """``immediate`` is a crash: no checkpoint, every connection cut."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def close(self) -> None:
        try:
            self.stop()
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.directory, ignore_errors=True)


class Proxy:
    """A TCP proxy on 127.0.0.1 (``address``) to `target`, in a thread of its own. ``cut()``
    drops every connection and refuses new ones (the port stays closed) until ``restore()``."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="test-proxy")
        self._thread.start()
        self._call(self._listen())

    def _call(self, coroutine: object) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port,
                                                  reuse_address=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()  # a reset, as a dead load balancer or network gives
        self._writers.clear()

    def cut(self) -> None:
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
