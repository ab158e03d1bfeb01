"""Local key derivation: the same canonical text, key and fingerprint the server derives.

    canonical   = JCS(arguments)                       -- RFC 8785
    key         = hex(sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical))
    fingerprint = hex(sha256("idem.v1.fp" 0x00 tool 0x00 canonical))

``JCS_LENIENT`` first trims Unicode White_Space around string values and drops null-valued
members, and hashes under ``idem.v1.lenient`` / ``idem.v1.lenient.fp``.

The parsing and serialization are those of the project's independent reference implementation
(``testdata/generate_key_vectors.py``), standard library only, and the tests check them against
every case of ``testdata/key-vectors.json`` and against the server. A refused input raises
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
import json
import math
import unicodedata
from collections.abc import Mapping
from typing import Any

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


class ArgumentsRefused(InvalidArgument):
    """Arguments the ledger refuses, found locally; ``reason`` is the server's reason string and
    ``field`` is ``arguments_json``, as in the server's error."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"arguments_json: {message}", reason=reason, field="arguments_json")


class _JsonObject:
    """A parsed object: members in input order, names unique."""

    __slots__ = ("members",)

    def __init__(self, members: list[tuple[str, object]]) -> None:
        self.members = members


# --- parsing (as the reference implementation) ------------------------------------------------


def _check_depth(text: str, max_depth: int) -> None:
    # Python's json module recurses once per level, so refuse deep text before handing it over.
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise ArgumentsRefused("JSON_TOO_DEEP", f"nesting deeper than {max_depth}")
        elif ch in "]}":
            depth -= 1


def _object(pairs: list[tuple[str, object]]) -> _JsonObject:
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise ArgumentsRefused("DUPLICATE_MEMBER", f"duplicate member name {name!r}")
        seen.add(name)
    return _JsonObject(pairs)


def _number(literal: str) -> float:
    """Reads a JSON number literal as JavaScript would. Only an integer literal (no fraction, no
    exponent) whose value a double cannot hold exactly is refused: two account numbers must never
    collapse into one key. A literal with a fraction or an exponent is a double and rounds like
    one (``1e23``, ``9007199254740993.0``); a value beyond the double range is refused."""
    value = float(literal)  # correctly rounded; underflow gives (signed) zero
    if math.isinf(value):
        raise ArgumentsRefused("UNSAFE_INTEGER", f"{literal[:64]} is beyond the double range")
    if any(c in literal for c in ".eE"):
        return value
    # A finite double has at most 309 integer digits, so int() never meets its digit limit here.
    if value != int(literal):  # Python compares int and float exactly
        raise ArgumentsRefused(
            "UNSAFE_INTEGER",
            f"{literal[:64]} is an integer a double cannot hold exactly (send it as a string)",
        )
    return value


def _refuse_constant(name: str) -> object:
    raise ArgumentsRefused("INVALID_JSON", f"{name} is not JSON")


def _check_surrogates(value: object) -> None:
    # json.loads joins valid \uXXXX pairs into one character and leaves lone halves as they are.
    def check(s: str) -> None:
        for ch in s:
            if 0xD800 <= ord(ch) <= 0xDFFF:
                raise ArgumentsRefused("LONE_SURROGATE", f"lone surrogate U+{ord(ch):04X}")

    if isinstance(value, str):
        check(value)
    elif isinstance(value, list):
        for item in value:
            _check_surrogates(item)
    elif isinstance(value, _JsonObject):
        for name, item in value.members:
            check(name)
            _check_surrogates(item)


def _parse(text: str, max_bytes: int, max_depth: int) -> object:
    """Parses strict RFC 8259 JSON into None/bool/float/str/list/_JsonObject."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ArgumentsRefused("ARGUMENTS_TOO_LARGE", f"{size} bytes, limit {max_bytes}")
    _check_depth(text, max_depth)
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_float=_number,
            parse_int=_number,
            parse_constant=_refuse_constant,
        )
    except json.JSONDecodeError as e:  # also refuses a BOM, control characters, trailing data
        raise ArgumentsRefused("INVALID_JSON", str(e)) from None
    _check_surrogates(value)
    return value


# --- serialization (as the reference implementation) ------------------------------------------


def _format_number(value: float) -> str:
    """ECMAScript Number::toString(value), which RFC 8785 adopts for numbers."""
    if value == 0:
        return "0"  # also -0
    if value < 0:
        return "-" + _format_number(-value)
    # repr gives the shortest digits that read back as the same double; only the layout differs.
    mantissa, _, exp = repr(value).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    point = len(int_part) + int(exp or "0")  # value = 0.<digits> * 10**point, before trimming
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    s = stripped.rstrip("0")
    k, n = len(s), point  # ECMAScript's k and n: value = s * 10**(n - k)
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + s
    e = n - 1
    exponent = ("+" if e > 0 else "-") + str(abs(e))
    return (s if k == 1 else s[0] + "." + s[1:]) + "e" + exponent


_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n",
                  "\r": "\\r", "\t": "\\t"}


def _format_string(s: str) -> str:
    """A JCS string: only '"', '\\' and U+0000..U+001F are escaped (and, for Python strings
    only, lone surrogates, which UTF-8 cannot carry: the ledger then refuses them by name)."""
    out = ['"']
    for ch in s:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch < " " or "\ud800" <= ch <= "\udfff":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_order(name: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly as UTF-16 code units do.
    return name.encode("utf-16-be", "surrogatepass")


def _serialize(value: object) -> str:
    """RFC 8785 (JCS) text for a parsed value."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return _format_number(value)
    if isinstance(value, str):
        return _format_string(value)
    if isinstance(value, list):
        return "[" + ",".join(_serialize(item) for item in value) + "]"
    if isinstance(value, _JsonObject):
        members = sorted(value.members, key=lambda m: _utf16_order(m[0]))
        return "{" + ",".join(_format_string(n) + ":" + _serialize(v) for n, v in members) + "}"
    raise TypeError(f"not a parsed JSON value: {value!r}")


def _lenient(value: object) -> object:
    """Trims White_Space around string values and drops null-valued members, at every depth."""
    if isinstance(value, str):
        return value.strip(WHITE_SPACE)
    if isinstance(value, list):
        return [_lenient(item) for item in value]
    if isinstance(value, _JsonObject):
        return _JsonObject([(n, _lenient(v)) for n, v in value.members if v is not None])
    return value


# --- Python objects ---------------------------------------------------------------------------


def _dump(value: Any, depth: int = 0) -> str:
    if depth > 10_000:  # a cycle, or absurd nesting (the ledger allows 64 levels by default)
        raise ValueError("arguments nest too deeply (a reference cycle?)")
    if value is None or value is True or value is False or isinstance(value, str):
        return _serialize(value)
    if isinstance(value, int):
        return str(int(value))  # all digits: the ledger decides whether a double holds it
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArgumentsRefused("INVALID_JSON", f"{value!r} is not JSON")
        if value.is_integer():
            return str(int(value))  # the double's exact value; 1e23 as 1e+23 would be refused
        return _format_number(value)
    if isinstance(value, Mapping):
        for name in value:
            if not isinstance(name, str):
                raise TypeError(f"object member names must be str, not {type(name).__name__}")
        members = sorted(value.items(), key=lambda m: _utf16_order(m[0]))
        return "{" + ",".join(
            _format_string(n) + ":" + _dump(v, depth + 1) for n, v in members
        ) + "}"
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
    value = _parse(arguments_json(arguments), max_bytes, max_depth)
    if not isinstance(value, _JsonObject):
        raise ArgumentsRefused("ARGUMENTS_NOT_OBJECT", "arguments must be a JSON object")
    if mode == JCS_LENIENT:
        value = _lenient(value)
    return _serialize(value)


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
