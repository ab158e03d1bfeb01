"""The installed stubs are what grpcio-tools generates from ../../proto now, under the package's
own namespace (no top-level ``idempotency`` package), and the client's enums mirror the
proto's."""

from __future__ import annotations

import filecmp
import importlib.util
from pathlib import Path

import pytest

from idempotency_ledger import Canonicalization, Outcome, Status
from idempotency_ledger._proto import ledger_pb2, ledger_pb2_grpc

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate", PACKAGE_ROOT / "generate.py")
assert _spec is not None and _spec.loader is not None
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)


def test_the_installed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    installed = Path(ledger_pb2.__file__).parent
    names = sorted(p.name for p in fresh)
    assert names == ["__init__.py", "ledger_pb2.py", "ledger_pb2.pyi", "ledger_pb2_grpc.py"]
    mismatch = [n for n in names if not filecmp.cmp(tmp_path / generate.PACKAGE / n,
                                                   installed / n, shallow=False)]
    assert not mismatch, f"stale stubs installed (rerun test.sh to reinstall): {mismatch}"


def test_the_stubs_live_under_the_package_and_keep_the_protos_names() -> None:
    assert ledger_pb2.__name__ == "idempotency_ledger._proto.ledger_pb2"
    assert ledger_pb2.DESCRIPTOR.package == "idempotency.v1"  # the wire's names, unchanged
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("idempotency.v1")


def test_the_service_has_the_four_rpcs() -> None:
    methods = ledger_pb2.DESCRIPTOR.services_by_name["LedgerService"].methods_by_name
    assert {"Claim", "Complete", "Lookup", "Reconcile"} <= set(methods)
    assert hasattr(ledger_pb2_grpc, "LedgerServiceStub")


def test_the_enums_mirror_the_proto() -> None:
    for enum, prefix, cls in ((ledger_pb2.Status, "STATUS_", Status),
                              (ledger_pb2.Outcome, "OUTCOME_", Outcome)):
        assert {name.removeprefix(prefix): number for name, number in enum.items()} == {
            m.name: m.value for m in cls
        }
    assert {n.removeprefix("CANONICALIZATION_") for n in ledger_pb2.Canonicalization.keys()} == {
        "UNSPECIFIED", *(m.value for m in Canonicalization)
    }
