"""Arguments read as RFC 8259 JSON and written as RFC 8785 (JCS) text, under the ledger's rules.

Written from those rules and the ledger's (what it refuses, and the reason it gives), not from the
project's reference generator, so that the shared key vectors stay evidence: the server, the
generator and this module each reach the vectors their own way. The reader is a scanner with an
explicit stack (so the configured depth, not Python's recursion limit, bounds the nesting); the
writer takes each number's shortest digits from ``repr`` and lays them out as ECMAScript's
Number::toString does, and each string as ``json.dumps`` escapes it, which is JCS's escaping.

Values: ``None``, ``True``, ``False``, ``float``, ``str``, ``list`` and :class:`Obj`.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal

from .errors import InvalidArgument


class ArgumentsRefused(InvalidArgument):
    """Arguments the ledger refuses, found locally; ``reason`` is the server's reason string and
    ``field`` is ``arguments_json``, as in the server's error."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"arguments_json: {message}", reason=reason, field="arguments_json")


class Obj:
    """An object: its members in the order they were read, their names unique."""

    __slots__ = ("members", "names")

    def __init__(self) -> None:
        self.members: list[tuple[str, object]] = []
        self.names: set[str] = set()

    def add(self, name: str, value: object) -> None:
        if name in self.names:
            raise ArgumentsRefused("DUPLICATE_MEMBER", f"the member {name!r} is given twice")
        self.names.add(name)
        self.members.append((name, value))


# RFC 8259: the four characters that may separate tokens, a number's grammar, and the
# characters a string may hold as they are (anything but '"', '\' and U+0000..U+001F).
_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = (("true", True), ("false", False), ("null", None))


def read(text: str, max_bytes: int, max_depth: int) -> object:
    """The value `text` holds; raises :class:`ArgumentsRefused` as the ledger would refuse it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ArgumentsRefused("ARGUMENTS_TOO_LARGE", f"{size} bytes, more than {max_bytes}")
    return _Reader(text, max_depth).document()


class _Reader:
    def __init__(self, text: str, max_depth: int) -> None:
        self.text = text
        self.at = 0
        self.max_depth = max_depth

    def refuse(self, what: str) -> ArgumentsRefused:
        return ArgumentsRefused("INVALID_JSON", f"{what} at character {self.at}")

    def space(self) -> str:
        """Skips white space; the next character, or '' at the end."""
        self.at = _SPACE.match(self.text, self.at).end()  # type: ignore[union-attr]
        return self.text[self.at : self.at + 1]

    def document(self) -> object:
        open_: list[Obj | list[object]] = []  # the containers being read, outermost first
        names: list[str] = []  # for each open object, the name of the member being read
        while True:
            # A value starts here: a scalar, or a container (which may end at once).
            ch = self.space()
            if ch in ("{", "["):
                if len(open_) == self.max_depth:
                    raise ArgumentsRefused("JSON_TOO_DEEP", f"nesting deeper than {self.max_depth}")
                self.at += 1
                container: Obj | list[object] = Obj() if ch == "{" else []
                if self.space() != ("}" if ch == "{" else "]"):
                    open_.append(container)
                    if ch == "{":
                        names.append(self.name())
                    continue
                self.at += 1
                value: object = container
            else:
                value = self.scalar(ch)
            # The value is whole: it goes into its container, which may end here, and so on out.
            while True:
                if not open_:
                    if self.space():
                        raise self.refuse("text after the value")
                    return value
                inner = open_[-1]
                if isinstance(inner, Obj):
                    inner.add(names[-1], value)
                else:
                    inner.append(value)
                ch = self.space()
                self.at += 1
                if ch == ",":
                    if isinstance(inner, Obj):
                        names[-1] = self.name()
                    break
                if ch != ("}" if isinstance(inner, Obj) else "]"):
                    self.at -= 1
                    raise self.refuse("a ',' or the container's end expected")
                open_.pop()
                if isinstance(inner, Obj):
                    names.pop()
                value = inner

    def name(self) -> str:
        """A member's name and the ':' after it."""
        if self.space() != '"':
            raise self.refuse("a member name expected")
        name = self.string()
        if self.space() != ":":
            raise self.refuse("a ':' expected")
        self.at += 1
        return name

    def scalar(self, ch: str) -> object:
        if ch == '"':
            return self.string()
        if ch == "-" or ch.isdigit():
            return self.number()
        for word, value in _LITERALS:
            if self.text.startswith(word, self.at):
                self.at += len(word)
                return value
        raise self.refuse("no JSON value" if ch else "the text ends where a value should be")

    def string(self) -> str:
        """The string starting at the '"' here."""
        self.at += 1
        parts: list[str] = []
        while True:
            plain = _PLAIN.match(self.text, self.at)
            if plain:
                parts.append(plain.group())
                self.at = plain.end()
            ch = self.text[self.at : self.at + 1]
            self.at += 1
            if ch == '"':
                break
            if ch != "\\":
                self.at -= 1
                raise self.refuse("a control character in a string" if ch else "an unended string")
            parts.append(self.escape())
        text = "".join(parts)
        for ch in text:
            if "\ud800" <= ch <= "\udfff":  # a raw one, in a Python string given as arguments
                raise ArgumentsRefused("LONE_SURROGATE", f"a lone surrogate U+{ord(ch):04X}")
        return text

    def escape(self) -> str:
        """The character of the escape after a '\\'; a surrogate pair is one character."""
        kind = self.text[self.at : self.at + 1]
        self.at += 1
        if kind in _ESCAPED:
            return _ESCAPED[kind]
        if kind != "u":
            raise self.refuse("an unknown escape")
        unit = self.code_unit()
        if 0xDC00 <= unit <= 0xDFFF:
            raise ArgumentsRefused("LONE_SURROGATE", f"a low surrogate \\u{unit:04x} alone")
        if 0xD800 <= unit <= 0xDBFF:
            if not self.text.startswith("\\u", self.at):
                raise ArgumentsRefused("LONE_SURROGATE", f"a high surrogate \\u{unit:04x} alone")
            self.at += 2
            low = self.code_unit()
            if not 0xDC00 <= low <= 0xDFFF:
                raise ArgumentsRefused("LONE_SURROGATE", f"a high surrogate \\u{unit:04x} alone")
            return chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
        return chr(unit)

    def code_unit(self) -> int:
        digits = self.text[self.at : self.at + 4]
        if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise self.refuse("a \\u escape without four hex digits")
        self.at += 4
        return int(digits, 16)

    def number(self) -> float:
        """A number, read as a double. An integer literal a double cannot hold exactly is
        refused (two account numbers must never become one key); a literal with a fraction or an
        exponent is a double and rounds as one; a magnitude beyond the doubles' is refused."""
        found = _NUMBER.match(self.text, self.at)
        if not found:
            raise self.refuse("a malformed number")
        literal = found.group()
        self.at = found.end()
        if found.group(1) or found.group(2):
            value = float(literal)
            if math.isinf(value):
                raise ArgumentsRefused(
                    "UNSAFE_INTEGER", f"{literal[:64]} is beyond the double range"
                )
            return value
        try:
            whole = int(literal)
            value = float(whole)
        except (OverflowError, ValueError):  # beyond a double, or past int's digit limit
            raise ArgumentsRefused(
                "UNSAFE_INTEGER", f"{literal[:64]} is beyond the double range"
            ) from None
        if value != whole:
            raise ArgumentsRefused(
                "UNSAFE_INTEGER",
                f"{literal[:64]} is an integer a double cannot hold exactly (send it as a string)",
            )
        return value


def number(value: float) -> str:
    """ECMAScript's Number::toString, which JCS adopts: `value`'s shortest round-trip digits
    (``repr``'s), laid out by the magnitude of their decimal point."""
    if value == 0:
        return "0"  # and -0
    if value < 0:
        return "-" + number(-value)
    _, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    s = "".join(map(str, digits))
    k = len(s)
    n = k + int(exponent)  # value = 0.s × 10**n
    if k <= n <= 21:
        return s + "0" * (n - k)
    if 0 < n <= 21:
        return f"{s[:n]}.{s[n:]}"
    if -6 < n <= 0:
        return "0." + "0" * -n + s
    mantissa = s if k == 1 else f"{s[0]}.{s[1:]}"
    return f"{mantissa}e{'+' if n > 0 else '-'}{abs(n - 1)}"


_SURROGATE = re.compile("[\ud800-\udfff]")


def string(value: str) -> str:
    """A JCS string: '"', '\\' and U+0000..U+001F escaped (short forms where JSON has one, else
    ``\\u00xx``), all else as it is; that is ``json.dumps``'s escaping without ``ensure_ascii``.
    A lone surrogate (only a Python string can hold one) is written as its escape, which the
    ledger then refuses by name."""
    text = json.dumps(value, ensure_ascii=False)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def by_name(member: tuple[str, object]) -> bytes:
    """The order of members: their names' UTF-16 code units (big-endian bytes compare alike)."""
    return member[0].encode("utf-16-be", "surrogatepass")


def write(value: object) -> str:
    """The JCS text of a value :func:`read` gave."""
    out: list[str] = []
    pending: list[object] = [value]  # values to write, and ready text (in a 1-tuple), last first
    while pending:
        item = pending.pop()
        if isinstance(item, tuple):
            out.append(item[0])
        elif item is None or item is True or item is False:
            out.append({None: "null", True: "true", False: "false"}[item])
        elif isinstance(item, float):
            out.append(number(item))
        elif isinstance(item, str):
            out.append(string(item))
        elif isinstance(item, list):
            pending.append(("]",))
            for i, element in enumerate(reversed(item)):
                pending.append(element)
                if i < len(item) - 1:
                    pending.append((",",))
            pending.append(("[",))
        elif isinstance(item, Obj):
            members = sorted(item.members, key=by_name)
            pending.append(("}",))
            for i, (name, element) in enumerate(reversed(members)):
                pending.append(element)
                pending.append((string(name) + ":",))
                if i < len(members) - 1:
                    pending.append((",",))
            pending.append(("{",))
        else:
            raise TypeError(f"not a value read from JSON: {item!r}")
    return "".join(out)


def lenient(value: object, white_space: str) -> object:
    """The lenient form: `white_space` trimmed around string values, members whose value is
    null dropped, at every depth (its depth is the read value's, which the limit bounds)."""
    if isinstance(value, str):
        return value.strip(white_space)
    if isinstance(value, list):
        return [lenient(item, white_space) for item in value]
    if isinstance(value, Obj):
        kept = Obj()
        for name, item in value.members:
            if item is not None:
                kept.add(name, lenient(item, white_space))
        return kept
    return value
