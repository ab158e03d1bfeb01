#!/usr/bin/env python3
"""Writes the seed corpus of the `canonicalize` fuzz target: the arguments_json of every case of
testdata/key-vectors.json (vector-<name>) and the edge cases below (edge-<name>). Re-run after
the vectors change: python3 fuzz/make_seed_corpus.py (it only adds and overwrites seeds)."""

import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "corpus" / "canonicalize"

EDGE = {
    # The documented exception: canonical text whose shortest-form integer is not exact.
    "canonical_form_of_2_pow_60_is_itself_refused": '{"n":1152921504606847000}',
    "two_pow_70_written_exactly": '{"n":1180591620717411303424}',
    "non_integer_above_2_pow_53": '{"n":123456789012345678901.5}',
    "two_pow_53_round_trips": '{"n":9007199254740992}',
    "two_pow_54_round_trips": '{"n":-18014398509481984}',
    "one_e22_round_trips": '{"n":1e22,"m":1E+0022}',
    "one_e20_prints_longer": '{"n":1e20,"m":-1e20}',
    "integer_through_negative_exponent": '{"a":100e-2,"b":0.5e1,"c":2000e-1,"d":0.002e5}',
    "zeros": '{"a":-0,"b":-0.0,"c":0e99999999999999999999,"d":-0E-5}',
    "huge_negative_exponent_underflows": '{"n":1e-99999999999999999999}',
    "huge_positive_exponent_overflows": '{"n":1e99999999999999999999}',
    "smallest_normal": '{"n":2.2250738585072014e-308}',
    "largest_double_short_form": '{"n":1.7976931348623157e308}',
    "fractions": '{"a":0.1,"b":0.30000000000000004,"c":1.5e-7,"d":-123.456e-3}',
    "sorting_non_bmp_after_e000_in_utf16": '{"\\ud83d\\ude00":1,"\\ue000":2,"\U0001F600x":3,"\ue000x":4}',
    "upper_case_surrogate_escape": '{"\\uD83D\\uDE00":"\\uD834\\uDD1E"}',
    "high_surrogate_then_bad_hex": '{"s":"\\ud800\\u12"}',
    "high_surrogate_at_end_of_text": '{"s":"\\ud800',
    "truncated_u_escape": '{"s":"\\u00',
    "backslash_at_end_of_text": '{"s":"\\',
    "raw_del_and_c1_controls": '{"s":"\x7f\x85\x9f"}',
    "nul_in_name_and_value": '{"a\\u0000":"\\u0000b"}',
    "all_short_escapes": '{"s":"\\"\\\\\\/\\b\\f\\n\\r\\t"}',
    "empty_containers": '{"a":[],"b":{},"c":[[]],"d":[{}],"e":""}',
    "lenient_white_space_and_nulls": '{"a":"\\u2028x\\u3000","b":null,"c":[null," y "],"d":{"e":null}}',
    "lenient_zero_width_space_is_kept": '{"a":"\\u200bx\\u200b","b":"\\u001f"}',
    "depth_4_is_the_small_limit": '{"a":[[[1]]]}',
    "depth_5_is_over_the_small_limit": '{"a":[[[[1]]]]}',
    "unclosed_deep_brackets": "[" * 70,
    "bytes_256_small_limit": '{"a":"' + "x" * 248 + '"}',
    "bytes_257_small_limit": '{"a":"' + "x" * 249 + '"}',
    "whitespace_everywhere": ' \t\r\n{ \n"a" \t:\r [ 1 , { "b" : null } ] ,"c":true }\n',
    "duplicate_in_array_object": '{"a":[{"x":1,"x":2}]}',
    "duplicate_after_nested_value": '{"a":{"b":1},"a":2}',
    "literal_prefixes": '{"a":tru}',
    "literal_then_garbage": '{"a":truex}',
    "minus_alone": '{"a":-}',
    "exponent_without_digits": '{"a":1e+}',
    "top_level_string": '"x"',
    "top_level_false": "false",
    "name_not_string": "{1:2}",
    "long_number_literal": '{"n":' + "1" * 100 + '}',
    "long_fraction_literal": '{"n":0.' + "0" * 300 + "1}",
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    vectors = json.loads((HERE.parent / "testdata" / "key-vectors.json").read_text("utf-8"))
    for case in vectors["cases"]:
        (OUT / f"vector-{case['name']}").write_bytes(case["arguments_json"].encode("utf-8"))
    for name, text in EDGE.items():
        (OUT / f"edge-{name}").write_bytes(text.encode("utf-8"))
    # Not UTF-8: passes trivially, but keeps the fuzzer's UTF-8 gate in the corpus.
    (OUT / "edge-not_utf8").write_bytes(b'{"a":"\xff\xfe"}')


if __name__ == "__main__":
    main()
