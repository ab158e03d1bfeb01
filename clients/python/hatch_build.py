"""The build hook (hatchling): the gRPC stubs are generated into the build, never into the
checkout, and the sdist carries the proto, so that it builds the same wheel without the
repository around it.

- wheel: ``generate.py`` writes the stubs into a temporary directory, from the sdist's
  ``proto/`` or the repository's ``../../proto``; they are added to the wheel as
  ``idempotency_ledger/_proto/``;
- sdist: ``../../proto/idempotency/v1/ledger.proto`` is added as ``proto/idempotency/v1/...``.

Nothing is written beside the sources, so a read-only checkout builds and installs.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate  # noqa: E402  (beside this file, in the checkout and in the sdist)


class StubsHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "sdist":
            source = generate.proto_root() / generate.PROTO_FILE
            build_data["force_include"][str(source)] = f"proto/{generate.PROTO_FILE}"
            return
        self._out = Path(tempfile.mkdtemp(prefix="ledger-stubs-"))
        for path in generate.generate(self._out):
            build_data["force_include"][str(path)] = str(path.relative_to(self._out))

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        out = getattr(self, "_out", None)
        if out is not None:
            shutil.rmtree(out, ignore_errors=True)
