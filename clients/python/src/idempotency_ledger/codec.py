"""How ``run_once`` turns an action's return value into the bytes the ledger stores, and back.

Agent tools return JSON, so :data:`JSON` is the default; :data:`BYTES` stores bytes as they are.
A codec is any object with ``encode(value) -> bytes`` and ``decode(data: bytes) -> value``.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

__all__ = ["BYTES", "JSON", "BytesCodec", "Codec", "JsonCodec"]


class Codec(Protocol):
    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """Compact UTF-8 JSON. NaN and the infinities are refused (they are not JSON); an empty
    stored result decodes as ``None``."""

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")

    def decode(self, data: bytes) -> Any:
        return json.loads(data) if data else None


class BytesCodec:
    """Bytes stored and replayed as they are (``str`` is stored as UTF-8, replayed as bytes)."""

    def encode(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode("utf-8")
        if value is None:
            return b""
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return data


JSON = JsonCodec()
BYTES = BytesCodec()
