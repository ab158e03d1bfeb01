#!/usr/bin/env python3
"""Reference implementation of the ledger's argument canonicalization and key derivation, and the
generator of key-vectors.json beside this file.

    canonical   = JCS(arguments)                       -- RFC 8785
    key         = hex(sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical))
    fingerprint = hex(sha256("idem.v1.fp" 0x00 tool 0x00 canonical))

The lenient form trims Unicode White_Space around string values and drops null-valued members
before JCS, and hashes under "idem.v1.lenient" / "idem.v1.lenient.fp".

This is written independently of the Rust server (standard library only, Python 3.11) so that
the vectors are evidence, not an echo: the Rust, Python and TypeScript tests must all agree with
the file this writes. It refuses the same inputs as the server and with the same reason strings,
but for text with several faults at once it may name a different one than the server does (the
vectors hold one fault each).

Usage:
    python3 generate_key_vectors.py           # rewrite key-vectors.json
    python3 generate_key_vectors.py --check   # exit 1 if key-vectors.json is out of date
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import unicodedata
from decimal import Decimal
from pathlib import Path

JCS = "JCS"
JCS_LENIENT = "JCS_LENIENT"
DEFAULT_MAX_BYTES = 1_048_576
DEFAULT_MAX_DEPTH = 64

# Characters with the Unicode White_Space property, which is what Rust's str::trim uses.
# Python's str.strip() without arguments is NOT the same: it also strips U+001C..U+001F.
WHITE_SPACE = "".join(
    map(
        chr,
        [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
         0x2028, 0x2029, 0x202F, 0x205F, 0x3000],
    )
)


class CanonicalError(ValueError):
    """Arguments refused; `reason` is the server's stable reason string."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


class JsonObject:
    """A parsed object: members in input order, names unique."""

    __slots__ = ("members",)

    def __init__(self, members: list[tuple[str, object]]) -> None:
        self.members = members


# --- parsing --------------------------------------------------------------------------------


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
                raise CanonicalError("JSON_TOO_DEEP", f"nesting deeper than {max_depth}")
        elif ch in "]}":
            depth -= 1


def _object(pairs: list[tuple[str, object]]) -> JsonObject:
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise CanonicalError("DUPLICATE_MEMBER", f"duplicate member name {name!r}")
        seen.add(name)
    return JsonObject(pairs)


def _number(literal: str) -> float:
    """Reads a JSON number literal as JavaScript would. An integer literal (no fraction, no
    exponent) whose value a double cannot hold exactly is refused; a literal with a fraction or
    an exponent is a double and rounds like one; a value beyond the double range is refused."""
    value = float(literal)  # correctly rounded; underflow gives (signed) zero
    if math.isinf(value):
        raise CanonicalError("UNSAFE_INTEGER", f"{literal[:64]} is beyond the double range")
    if any(c in literal for c in ".eE"):
        return value
    if value != int(literal):  # Python compares int and float exactly
        raise CanonicalError(
            "UNSAFE_INTEGER", f"{literal[:64]} is an integer a double cannot hold exactly"
        )
    return value


def _refuse_constant(name: str) -> object:
    raise CanonicalError("INVALID_JSON", f"{name} is not JSON")


def _check_surrogates(value: object) -> None:
    # json.loads joins valid \uXXXX pairs into one character and leaves lone halves as they are.
    def check(s: str) -> None:
        for ch in s:
            if 0xD800 <= ord(ch) <= 0xDFFF:
                raise CanonicalError("LONE_SURROGATE", f"lone surrogate U+{ord(ch):04X}")

    if isinstance(value, str):
        check(value)
    elif isinstance(value, list):
        for item in value:
            _check_surrogates(item)
    elif isinstance(value, JsonObject):
        for name, item in value.members:
            check(name)
            _check_surrogates(item)


def parse(
    text: str, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> object:
    """Parses strict RFC 8259 JSON into None/bool/float/str/list/JsonObject."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise CanonicalError("ARGUMENTS_TOO_LARGE", f"{size} bytes, limit {max_bytes}")
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
        raise CanonicalError("INVALID_JSON", str(e)) from None
    _check_surrogates(value)
    return value


# --- serialization --------------------------------------------------------------------------


def format_number(value: float) -> str:
    """ECMAScript Number::toString(value), which RFC 8785 adopts for numbers."""
    if value == 0:
        return "0"  # also -0
    if value < 0:
        return "-" + format_number(-value)
    # repr gives the shortest digits that read back as the same double (the closest such when
    # there are several), the digits ECMAScript asks for; only the layout differs.
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


def format_string(s: str) -> str:
    """A JCS string: only '"', '\\' and U+0000..U+001F are escaped."""
    out = ['"']
    for ch in s:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def serialize(value: object) -> str:
    """RFC 8785 (JCS) text for a parsed value."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, str):
        return format_string(value)
    if isinstance(value, list):
        return "[" + ",".join(serialize(item) for item in value) + "]"
    if isinstance(value, JsonObject):
        # Big-endian UTF-16 bytes compare exactly as UTF-16 code units do.
        members = sorted(value.members, key=lambda m: m[0].encode("utf-16-be"))
        return "{" + ",".join(format_string(n) + ":" + serialize(v) for n, v in members) + "}"
    raise TypeError(f"not a parsed JSON value: {value!r}")


def lenient(value: object) -> object:
    """Trims White_Space around string values and drops null-valued members, at every depth."""
    if isinstance(value, str):
        return value.strip(WHITE_SPACE)
    if isinstance(value, list):
        return [lenient(item) for item in value]
    if isinstance(value, JsonObject):
        return JsonObject([(n, lenient(v)) for n, v in value.members if v is not None])
    return value


def canonicalize(
    arguments_json: str,
    canonicalization: str = JCS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> str:
    """The canonical text of tool-call arguments. Raises CanonicalError when refused."""
    value = parse(arguments_json, max_bytes, max_depth)
    if not isinstance(value, JsonObject):
        raise CanonicalError("ARGUMENTS_NOT_OBJECT", "arguments must be a JSON object")
    if canonicalization == JCS_LENIENT:
        value = lenient(value)
    elif canonicalization != JCS:
        raise ValueError(f"unknown canonicalization {canonicalization!r}")
    return serialize(value)


# --- keys -----------------------------------------------------------------------------------


def check_name(field: str, s: str) -> str:
    """run_id and tool: 1 to 256 UTF-8 bytes, no control characters (Unicode Cc)."""
    if not 1 <= len(s.encode("utf-8")) <= 256:
        raise ValueError(f"{field}: must be 1 to 256 bytes")
    if any(unicodedata.category(ch) == "Cc" for ch in s):
        raise ValueError(f"{field}: must not contain control characters")
    return s


def _hash(*parts: str) -> str:
    return hashlib.sha256(b"\x00".join(p.encode("utf-8") for p in parts)).hexdigest()


def derive_key(run_id: str, tool: str, canonical: str, canonicalization: str = JCS) -> str:
    domain = "idem.v1.lenient" if canonicalization == JCS_LENIENT else "idem.v1"
    return _hash(domain, check_name("run_id", run_id), check_name("tool", tool), canonical)


def fingerprint(tool: str, canonical: str, canonicalization: str = JCS) -> str:
    domain = "idem.v1.lenient.fp" if canonicalization == JCS_LENIENT else "idem.v1.fp"
    return _hash(domain, check_name("tool", tool), canonical)


# --- the vectors ----------------------------------------------------------------------------

RUN = "run-1"
TOOL = "issue_credit"
BASE = '{"amount":200,"currency":"EUR"}'
MAX_DOUBLE_DIGITS = format(sys.float_info.max, ".0f")
RFC_SORT_INPUT = (
    r'{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh",'
    r'"1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control",'
    r'"\u00f6":"Latin Small Letter O With Diaeresis"}'
)


def case(name: str, arguments_json: str, **fields: object) -> dict:
    """One vector. `expect` (hand-written canonical text) and `error` are checked against the
    reference implementation; `same_key_as`, `different_key_from` and `same_fingerprint_as`
    name earlier cases and are written out for the readers to check too."""
    return {"name": name, "arguments_json": arguments_json, **fields}


CASES = [
    # Key order, whitespace and the anchor case the others compare against.
    case("compact_arguments", BASE, expect=BASE),
    case("member_order_does_not_matter", '{"currency":"EUR","amount":200}',
         same_key_as="compact_arguments"),
    case("insignificant_whitespace_is_removed",
         ' \n\t{ "currency" : "EUR" ,\r\n  "amount":\t200 }\n ', same_key_as="compact_arguments"),
    case("empty_object_is_two_braces", "{}", expect="{}",
         note="a tool without arguments sends {}"),
    case("nested_members_sort_at_every_depth",
         '{"customer":{"tier":"gold","id":"c-42"},"amount":200,'
         '"meta":{"z":{"b":1,"a":2},"a":[{"y":1,"x":2}]}}',
         expect='{"amount":200,"customer":{"id":"c-42","tier":"gold"},'
                '"meta":{"a":[{"x":2,"y":1}],"z":{"a":2,"b":1}}}'),
    case("names_sort_by_code_unit_with_prefixes_first", '{"b":1,"ab":2,"a":3,"A":4,"":5}',
         expect='{"":5,"A":4,"a":3,"ab":2,"b":1}'),
    # Number spellings of one value.
    case("number_200_0_is_200", '{"amount":200.0,"currency":"EUR"}',
         same_key_as="compact_arguments"),
    case("number_2e2_is_200", '{"amount":2e2,"currency":"EUR"}', same_key_as="compact_arguments"),
    case("number_2E_plus_2_is_200", '{"amount":2E+2,"currency":"EUR"}',
         same_key_as="compact_arguments"),
    case("number_2000e_minus_1_is_200", '{"amount":2000e-1,"currency":"EUR"}',
         same_key_as="compact_arguments"),
    case("number_0_2e3_is_200", '{"amount":0.2e3,"currency":"EUR"}',
         same_key_as="compact_arguments"),
    # ECMAScript number formatting.
    case("number_1e21_uses_exponent_form", '{"n":1e21}', expect='{"n":1e+21}'),
    case("number_1e20_is_written_out", '{"n":1e20}', expect='{"n":100000000000000000000}'),
    case("number_1e_minus_7_uses_exponent_form", '{"n":1e-7}', expect='{"n":1e-7}'),
    case("number_1e_minus_6_is_written_out", '{"n":1e-6}', expect='{"n":0.000001}'),
    case("negative_zero_is_zero", '{"n":-0,"m":-0.0,"z":0}', expect='{"m":0,"n":0,"z":0}'),
    case("number_0_1_stays_0_1", '{"n":0.1}', expect='{"n":0.1}'),
    case("number_0_1_plus_0_2_keeps_all_digits", '{"n":0.30000000000000004}',
         expect='{"n":0.30000000000000004}'),
    case("smallest_subnormal_5e_minus_324", '{"n":5e-324}', expect='{"n":5e-324}'),
    case("underflow_1e_minus_400_reads_as_zero", '{"n":1e-400}', expect='{"n":0}',
         note="as in JavaScript; not an integer, so not refused"),
    case("largest_double_written_exactly_is_accepted", '{"n":' + MAX_DOUBLE_DIGITS + "}",
         expect='{"n":1.7976931348623157e+308}',
         note="the exact integer value of the largest double"),
    case("largest_double_short_spelling_is_a_double", '{"n":1.7976931348623157e308}',
         expect='{"n":1.7976931348623157e+308}',
         note="written with an exponent, so a double, though mathematically an integer that "
              "no double equals"),
    case("max_safe_integer_plus_1_is_accepted", '{"n":9007199254740992}',
         expect='{"n":9007199254740992}', note="2^53"),
    case("negative_2_pow_53_is_accepted", '{"n":-9007199254740992}',
         expect='{"n":-9007199254740992}'),
    case("two_pow_60_is_exact_so_accepted", '{"n":1152921504606846976}',
         expect='{"n":1152921504606847000}',
         note="held exactly; printed with ECMAScript's shortest digits"),
    case("number_1e22_is_exact_so_accepted", '{"n":1e22}', expect='{"n":1e+22}'),
    case("non_integer_above_2_pow_53_rounds_like_javascript", '{"n":9007199254740993.5}',
         expect='{"n":9007199254740994}'),
    case("numbers_keep_shortest_round_trip_digits",
         '{"a":333333333.33333329,"b":4.50,"c":2e-3,"d":0.000000000000000000000000001,'
         '"e":-1.5,"f":123456789.125,"g":1.5e-300}',
         expect='{"a":333333333.3333333,"b":4.5,"c":0.002,"d":1e-27,"e":-1.5,'
                '"f":123456789.125,"g":1.5e-300}'),
    # Strings and escapes.
    case("escaped_solidus_and_letter_are_written_plainly", r'{"s":"\/\u0041"}',
         expect='{"s":"/A"}'),
    case("control_escapes_use_short_forms", r'{"s":"\b\f\n\r\t"}', expect=r'{"s":"\b\f\n\r\t"}'),
    case("quote_and_backslash_stay_escaped", r'{"s":"\"\\"}', expect=r'{"s":"\"\\"}'),
    case("other_controls_use_lowercase_u_escapes", r'{"s":"\u001F\u0001\u000b"}',
         expect=r'{"s":"\u001f\u0001\u000b"}'),
    case("del_u007f_is_written_literally", r'{"s":"\u007f"}', expect='{"s":"\x7f"}'),
    case("line_separator_u2028_is_written_literally", r'{"s":"\u2028\u2029"}',
         expect='{"s":"\u2028\u2029"}'),
    case("escaped_non_ascii_becomes_utf8", r'{"s":"\u00e9\u20AC\ud83d\ude00"}',
         expect='{"s":"\u00e9\u20ac\U0001F600"}'),
    case("raw_utf8_equals_its_escaped_form", '{"s":"\u00e9\u20ac\U0001F600"}',
         same_key_as="escaped_non_ascii_becomes_utf8"),
    case("nul_inside_a_string_is_kept", r'{"a\u0000b":"x\u0000"}',
         expect=r'{"a\u0000b":"x\u0000"}'),
    case("member_names_with_quotes_and_backslashes", r'{"a\\b":1,"a\"b":2}',
         expect=r'{"a\"b":2,"a\\b":1}'),
    case("member_names_sort_by_utf16_not_utf8", r'{"\ufb33":"dalet","\ud83d\ude00":"grin"}',
         expect='{"\U0001F600":"grin","\ufb33":"dalet"}',
         note="U+1F600 is D83D DE00 in UTF-16 (before FB33) but F0.. in UTF-8 (after EF..)"),
    case("rfc8785_sorting_example", RFC_SORT_INPUT,
         expect='{"\\r":"Carriage Return","1":"One","\x80":"Control",'
                '"\u00f6":"Latin Small Letter O With Diaeresis","\u20ac":"Euro Sign",'
                '"\U0001F600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter Dalet With Dagesh"}'),
    case("rfc8785_example_without_1e30",
         '{\n  "numbers": [333333333.33333329, 4.50, 2e-3, 0.000000000000000000000000001],\n'
         '  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n'
         '  "literals": [null, true, false]\n}',
         expect='{"literals":[null,true,false],"numbers":[333333333.3333333,4.5,0.002,1e-27],'
                '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
         note="RFC 8785 section 3.2.2 without 1E30 (the case below has it)"),
    case("rfc8785_number_example_with_1e30",
         '{"numbers":[333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001]}',
         expect='{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}',
         note="RFC 8785 section 3.2.2's numbers, whole: 1E30 has an exponent, so it is a double"),
    # Structure.
    case("arrays_keep_their_order", '{"steps":[3,1,2,"b","a",[2,1]]}',
         expect='{"steps":[3,1,2,"b","a",[2,1]]}'),
    case("nested_arrays_of_objects",
         '{"rows":[{"b":1,"a":2},[{"d":[{"f":1,"e":2}],"c":[]}]]}',
         expect='{"rows":[{"a":2,"b":1},[{"c":[],"d":[{"e":2,"f":1}]}]]}'),
    case("booleans_and_null", '{"t":true,"n":null,"f":false}',
         expect='{"f":false,"n":null,"t":true}'),
    case("depth_64_is_accepted", '{"a":' + "[" * 63 + "]" * 63 + "}",
         expect='{"a":' + "[" * 63 + "]" * 63 + "}", note="the object plus 63 arrays"),
    case("depth_limit_is_configurable", '{"a":[1]}', limits={"max_depth": 2},
         expect='{"a":[1]}'),
    case("text_exactly_at_the_byte_limit_is_accepted", '{"a":"12345678"}',
         limits={"max_bytes": 16}, expect='{"a":"12345678"}'),
    # Run id and tool.
    case("unicode_in_run_id_and_tool", BASE, run_id="ex\u00e9cution-7 \u2713",
         tool="\u9001\u4fe1_\u30e1\u30fc\u30eb", expect=BASE),
    case("another_run_gets_another_key_but_the_same_fingerprint", BASE, run_id="run-2",
         different_key_from="compact_arguments", same_fingerprint_as="compact_arguments"),
    case("another_tool_gets_another_key_and_fingerprint", BASE, tool="issue_refund",
         different_key_from="compact_arguments"),
    # The lenient form.
    case("lenient_same_canonical_text_still_gets_its_own_key", BASE, canonicalization=JCS_LENIENT,
         expect=BASE, different_key_from="compact_arguments"),
    case("lenient_trims_string_values_not_member_names",
         '{" name ":"  Ada Lovelace \\n","tags":[" x ","\\ty"],"amount":200}',
         canonicalization=JCS_LENIENT,
         expect='{" name ":"Ada Lovelace","amount":200,"tags":["x","y"]}'),
    case("lenient_trims_nbsp_but_not_zero_width_space",
         r'{"a":"\u00a0x\u00a0","b":"\u200by\u200b"}',
         canonicalization=JCS_LENIENT, expect='{"a":"x","b":"\u200by\u200b"}',
         note="U+00A0 has White_Space; U+200B does not"),
    case("lenient_trims_other_unicode_white_space", r'{"a":"\u0085\u3000\u2028x\u2029\u202f"}',
         canonicalization=JCS_LENIENT, expect='{"a":"x"}'),
    case("lenient_does_not_trim_unit_separator", r'{"a":"\u001fx\u001f"}',
         canonicalization=JCS_LENIENT, expect=r'{"a":"\u001fx\u001f"}',
         note="U+001F is not White_Space (Python's str.strip() would remove it)"),
    case("lenient_drops_null_members_at_every_depth",
         '{"a":null,"b":{"c":null,"d":{"e":null}},"f":1}', canonicalization=JCS_LENIENT,
         expect='{"b":{"d":{}},"f":1}'),
    case("lenient_keeps_nulls_in_arrays", '{"list":[null,1,null,{"x":null}]}',
         canonicalization=JCS_LENIENT, expect='{"list":[null,1,null,{}]}'),
    case("lenient_input_without_padding_or_nulls", '{"amount":200,"currency":"EUR"}',
         canonicalization=JCS_LENIENT,
         same_key_as="lenient_same_canonical_text_still_gets_its_own_key"),
    case("lenient_makes_padding_and_nulls_irrelevant",
         '{"currency":" EUR\\n","memo":null,"amount":200}', canonicalization=JCS_LENIENT,
         same_key_as="lenient_same_canonical_text_still_gets_its_own_key"),
    case("the_same_padded_input_under_jcs_keeps_padding_and_null",
         '{"currency":" EUR\\n","memo":null,"amount":200}',
         expect='{"amount":200,"currency":" EUR\\n","memo":null}',
         different_key_from="lenient_makes_padding_and_nulls_irrelevant"),
    case("lenient_still_refuses_duplicates_even_when_null", '{"a":null,"a":1}',
         canonicalization=JCS_LENIENT, error="DUPLICATE_MEMBER"),
    # INVALID_JSON.
    case("trailing_comma_in_object_is_refused", '{"a":1,}', error="INVALID_JSON"),
    case("trailing_comma_in_array_is_refused", '{"a":[1,2,]}', error="INVALID_JSON"),
    case("block_comment_is_refused", '{"a":1 /* note */}', error="INVALID_JSON"),
    case("line_comment_is_refused", '{"a":1 // note\n}', error="INVALID_JSON"),
    case("single_quotes_are_refused", "{'a':'x'}", error="INVALID_JSON"),
    case("unquoted_member_name_is_refused", "{a:1}", error="INVALID_JSON"),
    case("leading_zero_is_refused", '{"a":007}', error="INVALID_JSON"),
    case("leading_plus_is_refused", '{"a":+1}', error="INVALID_JSON"),
    case("decimal_point_without_digits_is_refused", '{"a":1.}', error="INVALID_JSON"),
    case("nan_is_refused", '{"a":NaN}', error="INVALID_JSON"),
    case("infinity_is_refused", '{"a":-Infinity}', error="INVALID_JSON"),
    case("unescaped_control_character_is_refused", '{"a":"x\x01y"}', error="INVALID_JSON"),
    case("unescaped_tab_in_string_is_refused", '{"a":"x\ty"}', error="INVALID_JSON"),
    case("unknown_escape_is_refused", r'{"a":"\x41"}', error="INVALID_JSON"),
    case("trailing_garbage_is_refused", '{"a":1} x', error="INVALID_JSON"),
    case("two_values_are_refused", "{}{}", error="INVALID_JSON"),
    case("truncated_text_is_refused", '{"a":', error="INVALID_JSON"),
    case("empty_text_is_refused", "", error="INVALID_JSON"),
    case("whitespace_only_is_refused", " \n", error="INVALID_JSON"),
    case("bare_bom_is_refused", "\ufeff", error="INVALID_JSON"),
    case("bom_before_object_is_refused", "\ufeff{}", error="INVALID_JSON"),
    case("nbsp_is_not_json_whitespace", "{\u00a0}", error="INVALID_JSON"),
    # DUPLICATE_MEMBER.
    case("duplicate_member_is_refused", '{"a":1,"a":2}', run_id="run-1", tool="t",
         error="DUPLICATE_MEMBER"),
    case("duplicate_member_after_unescaping_is_refused", r'{"a":1,"\u0061":1}',
         error="DUPLICATE_MEMBER"),
    case("duplicate_member_in_nested_object_is_refused", '{"x":[{"k":1,"j":0,"k":1}]}',
         error="DUPLICATE_MEMBER"),
    # LONE_SURROGATE.
    case("lone_high_surrogate_is_refused", r'{"s":"\ud800"}', error="LONE_SURROGATE"),
    case("lone_low_surrogate_is_refused", r'{"s":"\udc00"}', error="LONE_SURROGATE"),
    case("high_surrogate_before_non_surrogate_is_refused", r'{"s":"\ud83d\u0041"}',
         error="LONE_SURROGATE"),
    case("reversed_surrogate_pair_is_refused", r'{"s":"\ude00\ud83d"}', error="LONE_SURROGATE"),
    case("lone_surrogate_in_member_name_is_refused", r'{"\udfff":1}', error="LONE_SURROGATE"),
    # UNSAFE_INTEGER.
    case("two_pow_53_plus_1_is_refused", '{"n":9007199254740993}', error="UNSAFE_INTEGER"),
    case("negative_two_pow_53_minus_1_is_refused", '{"n":-9007199254740993}',
         error="UNSAFE_INTEGER"),
    case("integer_literal_beyond_the_double_range_is_refused", '{"n":1' + "0" * 400 + "}",
         error="UNSAFE_INTEGER"),
    # A fraction or an exponent makes a double, rounded as JavaScript rounds it.
    case("inexact_integer_with_fraction_spelling_is_a_double", '{"n":9007199254740993.0}',
         expect='{"n":9007199254740992}', note="rounds to 2^53 as JSON.parse does"),
    case("inexact_integer_with_exponent_spelling_is_a_double", '{"n":9.007199254740993e15}',
         expect='{"n":9007199254740992}'),
    case("number_1e23_is_a_double", '{"n":1e23}', expect='{"n":1e+23}',
         note="1e23 is not exactly 10^23 as a double; JCS prints the double"),
    case("number_1e30_from_rfc8785_is_a_double", '{"n":1E30}', expect='{"n":1e+30}'),
    case("exponent_spellings_of_one_double_share_a_key", '{"n":100000000000000000000000e-1}',
         same_key_as="number_1e22_is_exact_so_accepted"),
    case("number_1e400_is_refused", '{"n":1e400}', error="UNSAFE_INTEGER"),
    case("non_integer_beyond_double_range_is_refused", '{"n":1' + "0" * 400 + '.5}',
         error="UNSAFE_INTEGER", note="rounds to infinity, which JSON cannot carry"),
    # Limits and shape.
    case("depth_65_is_refused", '{"a":' + "[" * 64 + "]" * 64 + "}", error="JSON_TOO_DEEP"),
    case("configured_depth_limit_is_enforced", '{"a":[[1]]}', limits={"max_depth": 2},
         error="JSON_TOO_DEEP"),
    case("text_over_the_byte_limit_is_refused", '{"a":"123456789"}', limits={"max_bytes": 16},
         error="ARGUMENTS_TOO_LARGE"),
    case("byte_limit_counts_utf8_bytes_not_characters", '{"a":"\u00e9\u00e9\u00e9\u00e9\u00e9"}',
         limits={"max_bytes": 16}, error="ARGUMENTS_TOO_LARGE"),
    case("size_is_checked_before_syntax", "[" * 17, limits={"max_bytes": 16},
         error="ARGUMENTS_TOO_LARGE"),
    case("top_level_array_is_refused", "[1,2]", error="ARGUMENTS_NOT_OBJECT"),
    case("double_encoded_json_string_is_refused", '"{\\"a\\":1}"', error="ARGUMENTS_NOT_OBJECT"),
    case("top_level_number_is_refused", "42", error="ARGUMENTS_NOT_OBJECT"),
    case("top_level_null_is_refused", "null", error="ARGUMENTS_NOT_OBJECT"),
]


def build() -> dict:
    out_cases: list[dict] = []
    by_name: dict[str, dict] = {}
    for spec in CASES:
        spec = dict(spec)
        name = spec.pop("name")
        assert name not in by_name, f"duplicate case name {name}"
        arguments_json = spec.pop("arguments_json")
        run_id = spec.pop("run_id", RUN)
        tool = spec.pop("tool", TOOL)
        mode = spec.pop("canonicalization", JCS)
        limits = spec.pop("limits", None)
        expect = spec.pop("expect", None)
        error = spec.pop("error", None)
        note = spec.pop("note", None)
        relations = {k: spec.pop(k) for k in ("same_key_as", "different_key_from",
                                               "same_fingerprint_as") if k in spec}
        assert not spec, f"{name}: unknown fields {sorted(spec)}"
        full_limits = {"max_bytes": DEFAULT_MAX_BYTES, "max_depth": DEFAULT_MAX_DEPTH,
                       **(limits or {})}
        out: dict = {"name": name, "run_id": run_id, "tool": tool, "canonicalization": mode}
        if limits:
            out["limits"] = full_limits
        out["arguments_json"] = arguments_json
        try:
            canonical = canonicalize(arguments_json, mode, **full_limits)
        except CanonicalError as e:
            assert error == e.reason, f"{name}: expected {error}, refused with {e}"
            out["error"] = e.reason
        else:
            assert error is None, f"{name}: expected {error}, got {canonical!r}"
            assert expect is None or canonical == expect, f"{name}: {canonical!r} != {expect!r}"
            out["canonical"] = canonical
            out["key"] = derive_key(run_id, tool, canonical, mode)
            out["fingerprint"] = fingerprint(tool, canonical, mode)
        for relation, other_name in relations.items():
            other = by_name[other_name]
            field = "fingerprint" if relation == "same_fingerprint_as" else "key"
            same = out[field] == other[field]
            assert same == (relation != "different_key_from"), f"{name}: {relation} {other_name}"
            out[relation] = other_name
        if note:
            out["note"] = note
        by_name[name] = out
        out_cases.append(out)
    return {
        "description": (
            "Idempotency key vectors, generated by generate_key_vectors.py (an independent "
            "reference implementation; do not edit by hand). canonical = JCS(arguments) per "
            "RFC 8785; key = hex(sha256(\"idem.v1\" 0x00 run_id 0x00 tool 0x00 canonical)); "
            "fingerprint = hex(sha256(\"idem.v1.fp\" 0x00 tool 0x00 canonical)); JCS_LENIENT "
            "trims White_Space around string values and drops null members first, and hashes "
            "under idem.v1.lenient / idem.v1.lenient.fp. A case either has canonical, key and "
            "fingerprint, or error (the refusal reason). A case's optional limits replace the "
            "top-level ones. same_key_as, different_key_from and same_fingerprint_as name "
            "another case."
        ),
        "limits": {"max_bytes": DEFAULT_MAX_BYTES, "max_depth": DEFAULT_MAX_DEPTH},
        "cases": out_cases,
    }


def _self_test() -> None:
    # Anchors from the ECMAScript and RFC 8785 texts, independent of the cases above.
    for value, text in [(1e21, "1e+21"), (1e20, "100000000000000000000"), (1e-7, "1e-7"),
                        (1e-6, "0.000001"), (-0.0, "0"), (5e-324, "5e-324"), (123.0, "123"),
                        (-1.5, "-1.5"), (1.7976931348623157e308, "1.7976931348623157e+308"),
                        (2**60 * 1.0, "1152921504606847000"), (1.5e-300, "1.5e-300"),
                        (0.000001234, "0.000001234"), (1.234e-7, "1.234e-7"),
                        (1.2345e25, "1.2345e+25")]:
        assert format_number(value) == text, (value, format_number(value), text)


def main() -> int:
    _self_test()
    vectors = build()
    text = json.dumps(vectors, indent=2, ensure_ascii=True) + "\n"
    path = Path(__file__).with_name("key-vectors.json")
    if "--check" in sys.argv[1:]:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path} is out of date: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    print(f"wrote {len(vectors['cases'])} cases to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
