#!/usr/bin/env python3
"""Generates the Python gRPC stubs of the ledger's API with grpcio-tools, under the package's own
namespace: ``idempotency_ledger/_proto/ledger_pb2{.py,.pyi,_grpc.py}``.

    python generate.py --out DIR                # from ../../proto (the repository)
    python generate.py --out DIR --proto DIR    # from another proto root (an sdist's proto/)

The build runs it (``hatch_build.py``) into a directory of its own, never into the checkout; the
freshness test runs it into a temporary directory. The output is exactly what grpcio-tools
writes (``--python_out``, ``--pyi_out``, ``--grpc_python_out``), never edited afterwards: protoc
compiles a copy of ``idempotency/v1/ledger.proto`` placed at ``idempotency_ledger/_proto/``, so
the generated absolute import (``from idempotency_ledger._proto import ledger_pb2``) names this
package, while the messages keep their proto package, ``idempotency.v1``, on the wire. This
script adds the subpackage's ``__init__.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc  # a build-time dependency (pyproject's build-system.requires)

HERE = Path(__file__).resolve().parent
#: Where the proto is in the repository, and in an sdist (which carries a copy).
REPOSITORY_PROTO = HERE.parent.parent / "proto"
SDIST_PROTO = HERE / "proto"
PROTO_FILE = "idempotency/v1/ledger.proto"
#: Where the stubs go, under the output directory: the package's own namespace.
PACKAGE = "idempotency_ledger/_proto"
INIT = ('"""The gRPC stubs of idempotency/v1/ledger.proto, generated at build time by '
        'generate.py."""\n')


def proto_root() -> Path:
    """The proto root this build reads: an sdist's own copy, else the repository's."""
    for root in (SDIST_PROTO, REPOSITORY_PROTO):
        if (root / PROTO_FILE).is_file():
            return root
    raise FileNotFoundError(f"{PROTO_FILE} is in neither {SDIST_PROTO} nor {REPOSITORY_PROTO}: "
                            "build from the repository or from an sdist")


def generate(out: Path, root: Path | None = None) -> list[Path]:
    """Writes the stubs under `out` (replacing earlier ones there); returns the files written."""
    source = (root or proto_root()) / PROTO_FILE
    if not source.is_file():
        raise FileNotFoundError(f"{source} not found")
    target = out / PACKAGE
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    # The well-known types (google/protobuf/duration.proto, ...) that grpcio-tools ships.
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="ledger-proto-") as tree:
        placed = Path(tree) / PACKAGE / "ledger.proto"
        placed.parent.mkdir(parents=True)
        shutil.copyfile(source, placed)
        args = [
            "grpc_tools.protoc",
            f"--proto_path={tree}",
            f"--proto_path={well_known}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(placed),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
    (target / "__init__.py").write_text(INIT)
    return sorted(p for p in target.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True,
                        help="output root (the stubs go to OUT/idempotency_ledger/_proto)")
    parser.add_argument("--proto", type=Path, help="proto root (default: proto/ or ../../proto)")
    ns = parser.parse_args()
    for path in generate(ns.out, ns.proto):
        print(f"generated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
