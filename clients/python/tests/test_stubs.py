"""The installed stubs are what grpcio-tools generates from ../../proto now, and the client's
enums mirror the proto's."""

from __future__ import annotations

import filecmp
import sys
from pathlib import Path

from idempotency.v1 import ledger_pb2, ledger_pb2_grpc
from idempotency_ledger import Canonicalization, Outcome, Status

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    sys.path.insert(0, str(PACKAGE_ROOT))
    try:
        import generate
    finally:
        sys.path.remove(str(PACKAGE_ROOT))
    fresh = generate.generate(tmp_path)
    installed = Path(ledger_pb2.__file__).parent
    names = sorted(p.name for p in fresh)
    assert names == ["ledger_pb2.py", "ledger_pb2.pyi", "ledger_pb2_grpc.py", "py.typed"]
    mismatch = [n for n in names if not filecmp.cmp(tmp_path / "idempotency" / "v1" / n,
                                                   installed / n, shallow=False)]
    assert not mismatch, f"stale stubs installed (rerun test.sh to reinstall): {mismatch}"


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
