"""How ``run_once`` turns an action's return value into the bytes the ledger stores, and back.

Agent tools return JSON, so :data:`JSON` is the default; :data:`BYTES` stores bytes as they are.
A codec is any object with ``encode(value) -> bytes`` and ``decode(data: bytes) -> value``.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["BYTES", "JSON", "BytesCodec", "Codec", "JsonCodec", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """The JSON form of the typed values agent frameworks hand over and tools return: a pydantic
    model as ``model_dump(mode="json")``, a dataclass as its fields, an ``Enum`` as its value,
    dates and times in ISO 8601, a ``UUID`` and a ``Decimal`` as strings (exact), mappings and
    sequences member by member. Raises ``TypeError`` for anything else (a set, bytes, an
    arbitrary object): it has no JSON form that would mean one thing."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, item in value.items():
            if not isinstance(name, str):
                raise TypeError(f"object member names must be str, not {type(name).__name__}")
            out[name] = to_jsonable(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump) and hasattr(type(value), "model_fields"):  # pydantic v2
        return dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no JSON form: convert it to a str, number, "
                    "list or dict")


class Codec(Protocol):
    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """Compact UTF-8 JSON; pydantic models, dataclasses, enums, dates, UUIDs and decimals are
    stored in their JSON form (:func:`to_jsonable`), so they replay as plain dicts and strings.
    NaN and the infinities are refused (they are not JSON); an empty stored result decodes as
    ``None``."""

    def encode(self, value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                          default=to_jsonable).encode("utf-8")

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
