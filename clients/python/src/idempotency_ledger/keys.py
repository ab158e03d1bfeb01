"""Local key derivation: the same canonical text, key and fingerprint the server derives.

    canonical   = JCS(arguments)                       -- RFC 8785
    key         = hex(sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical))
    fingerprint = hex(sha256("idem.v1.fp" 0x00 tool 0x00 canonical))

``JCS_LENIENT`` first trims Unicode White_Space around string values and drops null-valued
members, and hashes under ``idem.v1.lenient`` / ``idem.v1.lenient.fp``.

The reading and writing (``_jcs``) are written from RFC 8259, RFC 8785 and the ledger's rules,
standard library only, independently of the project's reference generator
(``testdata/generate_key_vectors.py``); the tests check them against every case of
``testdata/key-vectors.json`` and against the server. A refused input raises
:class:`ArgumentsRefused` (an :class:`~idempotency_ledger.InvalidArgument`) whose ``reason`` is the
server's (``INVALID_JSON``, ``DUPLICATE_MEMBER``, ``LONE_SURROGATE``, ``UNSAFE_INTEGER``,
``JSON_TOO_DEEP``, ``ARGUMENTS_TOO_LARGE``, ``ARGUMENTS_NOT_OBJECT``).

Arguments are JSON text (``str``), used as given, or a Python object, serialized by
:func:`arguments_json` as follows:

- a ``dict`` (any ``Mapping``) with ``str`` keys is an object; ``list`` and ``tuple`` are arrays;
  ``str``, ``bool`` and ``None`` are strings, ``true``/``false`` and ``null``;
- an ``int`` is written with all its digits. It must be one an IEEE-754 double holds exactly
  (every integer up to 2**53 in magnitude, and larger ones such as 2**60 that happen to be a
  double): otherwise the ledger refuses it with ``UNSAFE_INTEGER``. Send large identifiers and
  exact amounts as strings (or ``decimal.Decimal`` converted to ``str``);
- a ``float`` is written so that it reads back as the same double (an integral one with all its
  digits), so every finite float is accepted; NaN and the infinities are not JSON and are refused
  (``INVALID_JSON``);
- anything else (``Decimal``, ``datetime``, ``bytes``, sets, non-``str`` keys) raises
  ``TypeError``, as ``json.dumps`` does: convert it yourself so that the key is what you meant.

The text is compact with members sorted, but the server canonicalizes it all the same: its number
spelling and ordering never matter for the key.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Mapping
from typing import Any

from . import _jcs
from ._jcs import ArgumentsRefused
from .errors import InvalidArgument

JCS = "JCS"
JCS_LENIENT = "JCS_LENIENT"
#: The server's default limits (``--max-arguments-bytes``, ``--max-json-depth``).
DEFAULT_MAX_BYTES = 1_048_576
DEFAULT_MAX_DEPTH = 64

# Characters with the Unicode White_Space property, which is what the server's str::trim uses.
# Python's str.strip() without arguments is NOT the same: it also strips U+001C..U+001F.
WHITE_SPACE = "".join(
    map(
        chr,
        [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
         0x2028, 0x2029, 0x202F, 0x205F, 0x3000],
    )
)

__all__ = [
    "JCS",
    "JCS_LENIENT",
    "ArgumentsRefused",
    "arguments_json",
    "canonicalize",
    "derive_key",
    "external_ref",
    "fingerprint",
]


# --- Python objects ---------------------------------------------------------------------------


def _dump(value: Any, depth: int = 0) -> str:
    if depth > 10_000:  # a cycle, or absurd nesting (the ledger allows 64 levels by default)
        raise ValueError("arguments nest too deeply (a reference cycle?)")
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return _jcs.string(value)
    if isinstance(value, int):
        return str(int(value))  # all digits: the ledger decides whether a double holds it
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArgumentsRefused("INVALID_JSON", f"{value!r} is not JSON")
        if value.is_integer():
            return str(int(value))  # the double's exact value; 1e23 as 1e+23 would be refused
        return _jcs.number(value)
    if isinstance(value, Mapping):
        for name in value:
            if not isinstance(name, str):
                raise TypeError(f"object member names must be str, not {type(name).__name__}")
        members = sorted(value.items(), key=_jcs.by_name)
        return "{" + ",".join(_jcs.string(n) + ":" + _dump(v, depth + 1) for n, v in members) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_dump(item, depth + 1) for item in value) + "]"
    raise TypeError(
        f"{type(value).__name__} is not a JSON value: convert it (a Decimal or a large id to str)"
    )


def arguments_json(arguments: str | Mapping[str, Any]) -> str:
    """The ``arguments_json`` text for `arguments`: JSON text as given, or a Python object
    serialized as described in this module's documentation."""
    if isinstance(arguments, str):
        return arguments
    return _dump(arguments)


# --- canonical text, key, fingerprint ---------------------------------------------------------


def _mode(canonicalization: object) -> str:
    mode = getattr(canonicalization, "value", canonicalization)  # accepts the Canonicalization enum
    if mode not in (JCS, JCS_LENIENT):
        raise ValueError(f"unknown canonicalization {canonicalization!r}: JCS or JCS_LENIENT")
    return str(mode)


def canonicalize(
    arguments: str | Mapping[str, Any],
    canonicalization: str = JCS,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> str:
    """The canonical text of tool-call arguments (JSON text or a Python object).

    Raises :class:`ArgumentsRefused` with the server's reason when the ledger would refuse them.
    `max_bytes` and `max_depth` are the server's limits (its defaults unless configured).
    """
    mode = _mode(canonicalization)
    value = _jcs.read(arguments_json(arguments), max_bytes, max_depth)
    if not isinstance(value, _jcs.Obj):
        raise ArgumentsRefused("ARGUMENTS_NOT_OBJECT", "arguments must be a JSON object")
    if mode == JCS_LENIENT:
        value = _jcs.lenient(value, WHITE_SPACE)
    return _jcs.write(value)


def _check_name(field: str, s: str) -> str:
    """run_id and tool: 1 to 256 UTF-8 bytes, no control characters (Unicode Cc)."""
    if not isinstance(s, str) or not 1 <= len(s.encode("utf-8", "surrogatepass")) <= 256:
        raise InvalidArgument(f"{field}: must be 1 to 256 bytes", reason="INVALID_FIELD",
                              field=field)
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in s):
        raise InvalidArgument(f"{field}: must not contain control characters",
                              reason="INVALID_FIELD", field=field)
    return s


def _hash(*parts: str) -> str:
    return hashlib.sha256(b"\x00".join(p.encode("utf-8") for p in parts)).hexdigest()


def derive_key(
    run_id: str,
    tool: str,
    arguments: str | Mapping[str, Any],
    canonicalization: str = JCS,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> str:
    """The key the ledger derives for this run, tool and arguments (64 lowercase hex digits)."""
    mode = _mode(canonicalization)
    canonical = canonicalize(arguments, mode, max_bytes=max_bytes, max_depth=max_depth)
    domain = "idem.v1.lenient" if mode == JCS_LENIENT else "idem.v1"
    return _hash(domain, _check_name("run_id", run_id), _check_name("tool", tool), canonical)


def fingerprint(
    tool: str,
    arguments: str | Mapping[str, Any],
    canonicalization: str = JCS,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> str:
    """The fingerprint of (tool, arguments), against which the ledger checks an explicit key."""
    mode = _mode(canonicalization)
    canonical = canonicalize(arguments, mode, max_bytes=max_bytes, max_depth=max_depth)
    domain = "idem.v1.lenient.fp" if mode == JCS_LENIENT else "idem.v1.fp"
    return _hash(domain, _check_name("tool", tool), canonical)


def external_ref(key: str, *, derived: bool = True, prefix: str = "idem-") -> str:
    """The entry's ``external_ref``: `prefix` (the server's ``--external-ref-prefix``) plus the
    first 16 hex digits of a derived key, or of sha256(key) for an explicit key."""
    digest = key if derived else hashlib.sha256(key.encode("utf-8")).hexdigest()
    return prefix + digest[:16]
