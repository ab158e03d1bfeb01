"""Local key derivation agrees with the shared vectors (every case) and with the server."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import pytest

from idempotency_ledger import (
    ArgumentsRefused,
    Canonicalization,
    InvalidArgument,
    Ledger,
    arguments_json,
    canonicalize,
    derive_key,
    external_ref,
    fingerprint,
)

VECTORS_PATH = Path(__file__).resolve().parents[3] / "testdata" / "key-vectors.json"
VECTORS = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
CASES = VECTORS["cases"]
ACCEPTED = [c for c in CASES if "error" not in c]
REFUSED = [c for c in CASES if "error" in c]
# The server runs with the default limits; cases with other limits are checked locally only.
AT_DEFAULT_LIMITS = [c for c in CASES if "limits" not in c]


def _limits(case: dict) -> dict:
    return case.get("limits", VECTORS["limits"])


def test_the_vectors_file_has_both_kinds_of_case() -> None:
    assert len(CASES) == len(ACCEPTED) + len(REFUSED) >= 100
    assert ACCEPTED and REFUSED


@pytest.mark.parametrize("case", ACCEPTED, ids=[c["name"] for c in ACCEPTED])
def test_accepted_vector(case: dict) -> None:
    mode, limits = case["canonicalization"], _limits(case)
    args = case["arguments_json"]
    assert canonicalize(args, mode, **limits) == case["canonical"]
    assert derive_key(case["run_id"], case["tool"], args, mode, **limits) == case["key"]
    assert fingerprint(case["tool"], args, mode, **limits) == case["fingerprint"]


@pytest.mark.parametrize("case", REFUSED, ids=[c["name"] for c in REFUSED])
def test_refused_vector(case: dict) -> None:
    with pytest.raises(ArgumentsRefused) as refused:
        derive_key(case["run_id"], case["tool"], case["arguments_json"],
                   case["canonicalization"], **_limits(case))
    assert refused.value.reason == case["error"]
    assert refused.value.field == "arguments_json"
    assert isinstance(refused.value, InvalidArgument)


def test_the_server_derives_the_same_keys_and_refuses_the_same_inputs(ledger: Ledger) -> None:
    """Every vector at the default limits, claimed through gRPC."""
    for case in AT_DEFAULT_LIMITS:
        mode = Canonicalization(case["canonicalization"])
        try:
            claim = ledger.claim(case["run_id"], case["tool"], case["arguments_json"],
                                 canonicalization=mode)
        except InvalidArgument as e:
            assert e.reason == case.get("error"), case["name"]
            assert e.field == "arguments_json", case["name"]
            continue
        assert "error" not in case, f"{case['name']}: the server accepted it"
        assert claim.entry.key == case["key"], case["name"]
        assert claim.entry.fingerprint == case["fingerprint"], case["name"]
        assert claim.entry.external_ref == external_ref(case["key"]), case["name"]


# --- Python objects ---------------------------------------------------------------------------


def test_a_dict_gives_the_key_of_its_json_text_whatever_the_order() -> None:
    text_key = derive_key("run-1", "issue_credit", '{"amount":200,"currency":"EUR"}')
    assert derive_key("run-1", "issue_credit", {"currency": "EUR", "amount": 200}) == text_key
    assert derive_key("run-1", "issue_credit", {"amount": 200.0, "currency": "EUR"}) == text_key
    assert text_key == CASES[0]["key"]


def test_python_values_map_to_json_values() -> None:
    args = {"t": True, "f": False, "n": None, "list": (1, [2.5, "x"]), "nested": {"b": 1, "a": 2}}
    assert canonicalize(args) == (
        '{"f":false,"list":[1,[2.5,"x"]],"n":null,"nested":{"a":2,"b":1},"t":true}'
    )


def test_nul_characters_are_kept() -> None:
    nul_case = next(c for c in CASES if c["name"] == "nul_inside_a_string_is_kept")
    assert derive_key("run-1", "issue_credit", {"a\x00b": "x\x00"}) == nul_case["key"]


def test_member_names_sort_by_utf16_code_units() -> None:
    case = next(c for c in CASES if c["name"] == "member_names_sort_by_utf16_not_utf8")
    assert canonicalize({"\ufb33": "dalet", "\U0001F600": "grin"}) == case["canonical"]


def test_integers_must_fit_a_double_exactly() -> None:
    assert canonicalize({"n": 2**53}) == '{"n":9007199254740992}'
    assert canonicalize({"n": 2**60}) == '{"n":1152921504606847000}'
    with pytest.raises(ArgumentsRefused) as refused:
        derive_key("run-1", "t", {"n": 2**53 + 1})
    assert refused.value.reason == "UNSAFE_INTEGER"
    with pytest.raises(ArgumentsRefused, match="UNSAFE_INTEGER"):
        canonicalize({"n": 10**400})


def test_an_integer_literal_must_fit_but_a_float_is_a_double() -> None:
    # The refined rule: only integer literals are refused; 1e23 written as a float is a double.
    with pytest.raises(ArgumentsRefused) as refused:
        canonicalize({"n": 10**23})  # a Python int: written as an integer literal
    assert refused.value.reason == "UNSAFE_INTEGER"
    assert canonicalize('{"n":1e23}') == canonicalize({"n": 1e23}) == '{"n":1e+23}'
    assert canonicalize('{"n":9007199254740993.0}') == '{"n":9007199254740992}'
    assert canonicalize('{"n":9007199254740993e0}') == '{"n":9007199254740992}'
    with pytest.raises(ArgumentsRefused, match="UNSAFE_INTEGER"):
        canonicalize('{"n":9007199254740993}')
    with pytest.raises(ArgumentsRefused, match="beyond the double range"):
        canonicalize('{"n":1e309}')


def test_every_finite_float_is_accepted() -> None:
    # 1e23 as a double is 99999999999999991611392: written with all its digits it is exact,
    # and canonical JCS prints it back as 1e+23.
    assert arguments_json({"n": 1e23}) == '{"n":99999999999999991611392}'
    assert canonicalize({"n": 1e23}) == '{"n":1e+23}'
    assert canonicalize({"n": 0.1, "m": -0.0, "s": 5e-324}) == '{"m":0,"n":0.1,"s":5e-324}'
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ArgumentsRefused) as refused:
            canonicalize({"n": bad})
        assert refused.value.reason == "INVALID_JSON"


def test_values_json_has_no_form_for_are_type_errors() -> None:
    for bad in ({"n": Decimal("1.5")}, {"s": {1, 2}}, {1: "x"}, {"b": b"x"}):
        with pytest.raises(TypeError):
            arguments_json(bad)


def test_lone_surrogates_are_refused_by_name() -> None:
    with pytest.raises(ArgumentsRefused) as refused:
        canonicalize({"s": "\ud800"})
    assert refused.value.reason == "LONE_SURROGATE"


def test_the_arguments_must_be_an_object() -> None:
    with pytest.raises(ArgumentsRefused) as refused:
        canonicalize("[1,2]")
    assert refused.value.reason == "ARGUMENTS_NOT_OBJECT"


def test_run_id_and_tool_are_checked() -> None:
    for run_id, tool, field in (("", "t", "run_id"), ("r", "", "tool"), ("r\n", "t", "run_id"),
                                ("r", "x" * 257, "tool")):
        with pytest.raises(InvalidArgument) as refused:
            derive_key(run_id, tool, "{}")
        assert (refused.value.reason, refused.value.field) == ("INVALID_FIELD", field)


def test_python_objects_get_the_servers_keys_and_refusals(ledger: Ledger, run_id: str) -> None:
    objects = [
        {"customer": "c-42", "amount": 200, "currency": "EUR"},
        {"n": 1e23, "m": 2**60, "f": 0.30000000000000004, "neg": -1.5e-300},
        {"text": "caf\u00e9 \U0001F600 \x00 \u2028", "list": [None, True, {"z": 1, "a": [{}]}]},
        {"padded": "  x  ", "gone": None},
    ]
    for mode in Canonicalization:
        for args in objects:
            claim = ledger.claim(run_id, "tool", args, canonicalization=mode)
            assert claim.entry.key == derive_key(run_id, "tool", args, mode)
            assert claim.entry.fingerprint == fingerprint("tool", args, mode)
    for args, reason in (({"n": 2**53 + 1}, "UNSAFE_INTEGER"), ({"s": "\udc00"}, "LONE_SURROGATE")):
        with pytest.raises(InvalidArgument) as refused:
            ledger.claim(run_id, "tool", args)
        assert refused.value.reason == reason


def test_external_ref_of_an_explicit_key(ledger: Ledger, run_id: str) -> None:
    key = f"workflow-{run_id}:step-1"
    claim = ledger.claim("", "tool", {}, key=key)
    assert claim.entry.key == key
    assert claim.entry.external_ref == external_ref(key, derived=False)


def test_the_readme_example_key_is_the_walkthroughs() -> None:
    """clients/python/README.md shows this key; the walk-through of docs/agents.md claims it."""
    args = {"customer": "c-42", "amount": 200, "currency": "EUR"}
    assert derive_key("run-7f3a", "issue_credit", args) == (
        "43ba67c5ba6df15d441f50062f986b45a45acf6939a3175662c2afcb9c8678bb"
    )
