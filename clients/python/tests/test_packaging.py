"""The package builds as a wheel and an sdist from a read-only checkout, writes nothing beside
its sources, and each installs and works without the repository around it: the stubs are
generated into the build, under the package's own namespace; the sdist carries the proto."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from idempotency_ledger.testing import LedgerServer

CLIENT = Path(__file__).resolve().parents[1]
REPOSITORY = CLIENT.parents[1]
SKIP = {".venv", "build", "dist", "__pycache__", ".pytest_cache"}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with the hash of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def read_only(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of what the package is built from (the client and the proto), read-only."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(REPOSITORY / "proto", root / "proto")
    shutil.copytree(CLIENT, root / "clients" / "python",
                    ignore=lambda _, names: [n for n in names if n in SKIP
                                             or n.endswith(".egg-info")])
    read_only(root)  # as root (CI) permissions do not stop a write: the snapshot does
    yield root
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.fixture(scope="module")
def dist(checkout: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    before = snapshot(checkout)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir",
         str(out), str(checkout / "clients" / "python")],
        capture_output=True, text=True, timeout=600, cwd=out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert snapshot(checkout) == before, "the build wrote into the checkout"
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_holds_the_stubs_under_the_package(dist: dict[str, Path]) -> None:
    names = zipfile.ZipFile(dist["wheel"]).namelist()
    for stub in ("__init__.py", "ledger_pb2.py", "ledger_pb2.pyi", "ledger_pb2_grpc.py"):
        assert f"idempotency_ledger/_proto/{stub}" in names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"idempotency_ledger"}  # no top-level idempotency package


def test_the_sdist_carries_the_proto_and_no_generated_code(dist: dict[str, Path]) -> None:
    names = {n.split("/", 1)[1] for n in tarfile.open(dist["sdist"]).getnames() if "/" in n}
    assert {"proto/idempotency/v1/ledger.proto", "generate.py", "hatch_build.py",
            "pyproject.toml", "src/idempotency_ledger/__init__.py"} <= names
    assert not any("_pb2" in n for n in names)


def works(site: Path, server: LedgerServer) -> None:
    """The package installed in `site` imports from there and claims against the server."""
    code = ("import idempotency_ledger as il, sys\n"
            f"assert il.__file__.startswith({str(site)!r}), il.__file__\n"
            "from idempotency_ledger._proto import ledger_pb2\n"
            f"with il.Ledger({server.address!r}) as ledger:\n"
            "    r = ledger.run_once('run-p', 'packaged', {}, lambda a: {'ok': 1})\n"
            "    assert r.value == {'ok': 1}, r\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, cwd=site)
    assert done.returncode == 0, done.stderr


def test_the_wheel_installs_and_works_without_the_repository(
        dist: dict[str, Path], server: LedgerServer, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), str(dist["wheel"])], check=True, timeout=300)
    works(site, server)


def test_the_sdist_builds_and_installs_without_the_repository(
        dist: dict[str, Path], server: LedgerServer, tmp_path: Path) -> None:
    # Unpacked far from any proto/ but its own, and built from there.
    unpacked = tmp_path / "unpacked"
    with tarfile.open(dist["sdist"]) as archive:
        archive.extractall(unpacked, filter="data")
    (source,) = unpacked.iterdir()
    assert not (source.parent.parent / "proto").exists()
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(source)],
                   check=True, timeout=300)
    works(site, server)
