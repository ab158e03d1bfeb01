"""Sizes a reader can hold (issue 29, item 7): no module of the package is over 600 lines (the
generated gRPC stubs aside)."""

from __future__ import annotations

from pathlib import Path

import pytest

import idempotency_ledger

PACKAGE = Path(idempotency_ledger.__file__).resolve().parent
MAX_LINES = 600
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "_proto" not in p.relative_to(PACKAGE).parts)


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_module_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (f"{path.name} is {lines} lines: split it along a seam a reader "
                                f"recognises (a private module with a docstring saying what it "
                                f"holds, in tests/test_layers.py's LAYERS)")
