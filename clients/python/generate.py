#!/usr/bin/env python3
"""Generates the Python gRPC stubs of the ledger's API from ../../proto with grpcio-tools.

    python generate.py               # write src/idempotency/v1/ledger_pb2{.py,.pyi,_grpc.py}
    python generate.py --out DIR     # write them under DIR instead (the freshness test uses it)

The output is exactly what grpcio-tools writes (``--python_out``, ``--pyi_out``,
``--grpc_python_out``), never edited afterwards: it lands at ``idempotency/v1/`` under the output
directory, the proto's own package path, so the generated absolute imports
(``from idempotency.v1 import ledger_pb2``) work as generated. ``idempotency`` and
``idempotency.v1`` are PEP 420 namespace packages; this script adds only the PEP 561 ``py.typed``
marker beside the ``.pyi`` stubs.

setup.py runs this on every build from the repository, so ``pip install ./clients/python`` always
ships stubs of the proto it was built from. The generated files are not committed (.gitignore).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO_FILES = ("idempotency/v1/ledger.proto",)
DEFAULT_OUT = HERE / "src"
# The generated top-level package: the proto package's first component.
GENERATED_PACKAGE = "idempotency"


def generate(out: Path = DEFAULT_OUT, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Writes the stubs under `out` (replacing earlier ones) and returns the files written."""
    from grpc_tools import protoc  # a build-time dependency only

    for name in PROTO_FILES:
        if not (proto_root / name).is_file():
            raise FileNotFoundError(f"{proto_root / name} not found: generate from the repository")
    shutil.rmtree(out / GENERATED_PACKAGE, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    # The well-known types (google/protobuf/duration.proto, ...) that grpcio-tools ships.
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={proto_root}",
        f"--proto_path={well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(proto_root / name) for name in PROTO_FILES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = sorted(p for p in (out / GENERATED_PACKAGE).rglob("*") if p.is_file())
    for directory in {p.parent for p in written}:
        (directory / "py.typed").write_text("")
    return sorted(p for p in (out / GENERATED_PACKAGE).rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output root (default: src)")
    parser.add_argument("--proto", type=Path, default=PROTO_ROOT, help="proto root (../../proto)")
    ns = parser.parse_args()
    for path in generate(ns.out, ns.proto):
        print(f"generated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
