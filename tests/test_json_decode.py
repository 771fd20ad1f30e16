"""``provider_router._json.loads`` (orjson first) decodes exactly what ``json.loads`` does.

orjson is taken only where it gives ``json.loads``' very value; everywhere else
``json`` decodes (the module doc says where and why). "The same" here is strict:
the same types all the way down (``1`` is not ``1.0`` nor ``True``), floats by
``repr`` (``-0.0``, ``nan``, the last digit), dict keys in the same order, and for a
body ``json.loads`` refuses, the same exception type and message. The exact-cost
pin on top of it (the wire's digits of ``usage.cost``) is held by
``tests/client/test_wire_exact.py`` over a real socket.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from provider_router._json import loads


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)


def _outcome(decode: Any, body: bytes) -> tuple[str, Any]:
    try:
        return ("value", decode(body))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        return ("error", (type(exc), str(exc)))


def _assert_same_as_json(body: bytes) -> None:
    expected = _outcome(json.loads, body)
    got = _outcome(loads, body)
    assert got[0] == expected[0], (body, got, expected)
    if got[0] == "value":
        assert _same(got[1], expected[1]), (body, got[1], expected[1])
    else:
        assert got[1] == expected[1], body


def test_same_is_strict() -> None:
    """The comparison itself tells apart what ``==`` would let through."""
    assert not _same(1, 1.0)
    assert not _same(1, True)
    assert not _same(0.0, -0.0)
    assert not _same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not _same(float(2**64), 2**64)
    assert _same(math.nan, math.nan)
    assert _same({"a": [1, 2.5, None, "x"]}, {"a": [1, 2.5, None, "x"]})


# Bodies where orjson alone would differ from json.loads (value or error), and the
# usual ones: each must come out exactly as json.loads gives it.
EDGE_CASES = [
    b"[18446744073709551615]",  # u64 max: orjson exact
    b"[18446744073709551616]",  # one more: orjson would give a float
    b"[-9223372036854775808]",  # i64 min: orjson exact
    b"[-9223372036854775809]",  # one less: orjson would give a float
    b'{"cost": 123456789012345678901234567890}',
    b"[100000000000000000000000000000000000000000000000000e-30]",
    b'"1234567890123456789012"',  # a long digit run in a string: json decodes it
    b"1e400",  # orjson refuses; json: inf
    b"[-1e400, 1.7976931348623159e308]",
    b"[1e-400, -1e-400, 2.5e-324, -2.5e-324, 4.9406564584124654e-324]",
    b"[2.2250738585072011e-308, 1.7976931348623157e308, 9007199254740993.0]",
    b"[0.1, 0.30000000000000004, 1E5, 1e+5, 1.5e-7, 5e-324]",
    b"[NaN, Infinity, -Infinity]",
    b"[-0, -0.0, 0, 0.0, -0e5]",
    b'{"a": 1, "b": 2, "a": 3}',  # duplicate key: the last value, the first place
    b'{"\\u00e9": 1, "\xc3\xa9": 2}',  # the same key escaped and not
    b'"\\ud800"',  # a lone surrogate, escaped: json keeps it, orjson refuses
    b'"\\udc00x"',
    b'"\\ud83d\\ude00"',  # a pair: one character
    b'"\xed\xa0\x80"',  # an encoded surrogate: json's surrogatepass keeps it
    b'"\xf0\x9f\x98\x80 \xe2\x80\xa8"',
    b'"\\u0000\\n\\t\\"\\\\\\/"',
    b'"a\x01b"',  # a raw control character: both refuse
    b'"\x7f"',
    b"\xef\xbb\xbf{}",  # a UTF-8 BOM: json strips it, orjson refuses
    '{"a": "é"}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-32"),
    b"\xff",
    b'"\xc0\xaf"',  # an overlong encoding
    b'"\xf4\x90\x80\x80"',  # beyond U+10FFFF
    b"",
    b"  ",
    b"\x00",
    b"{}\x0c",
    b"01",
    b"1.",
    b".5",
    b"+1",
    b"[1,]",
    b'{"a":1,}',
    b'"\\x"',
    b"{} x",
    b"[1] [2]",
    b'\n\n   {"a": 1}\n',
    b"true",
    b"null",
    b"[" * 1100 + b"]" * 1100,  # deeper than orjson's limit
    b"[" * 100_000,  # deeper than json's recursion limit: RecursionError both ways
]


@pytest.mark.parametrize("body", EDGE_CASES)
def test_edge_cases_decode_as_json_loads_does(body: bytes) -> None:
    _assert_same_as_json(body)


def test_the_edge_cases_include_what_orjson_alone_gets_wrong() -> None:
    """The guard is needed: orjson by itself turns a 65-bit integer into a float."""
    assert type(orjson.loads(b"18446744073709551616")) is float
    assert type(loads(b"18446744073709551616")) is int
    assert type(orjson.loads(b"-9223372036854775809")) is float
    assert loads(b"-9223372036854775809") == -9223372036854775809


def test_a_real_answer_decodes_with_orjson_and_keeps_its_exact_cost() -> None:
    """An answer as the local OpenRouter writes it (leading blanks included)."""
    body = (
        b'\n   \n{"id":"gen-1796078688-LjR4vEUzJWnah9EvUvjU","provider":"Chutes",'
        b'"created":1796078688,"choices":[{"finish_reason":"stop","index":0,'
        b'"message":{"role":"assistant","content":"hi","reasoning":null}}],'
        b'"usage":{"prompt_tokens":16,"completion_tokens":10,"total_tokens":26,'
        b'"cost":2.92e-05,"cost_details":{"upstream_inference_cost":2.92e-05}}}'
    )
    _assert_same_as_json(body)
    assert _same(orjson.loads(body), json.loads(body))  # the fast path, not the fallback


# --- hypothesis ---------------------------------------------------------------

_INTS = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18]),
)
_FLOATS = st.floats(allow_nan=True, allow_infinity=True)
_TEXT = st.text(st.characters(codec=None), max_size=12)  # surrogates included
_SCALARS = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(_TEXT, inner, max_size=5),
    ),
    max_leaves=25,
)


@settings(max_examples=400, deadline=None)
@given(_VALUES, st.booleans(), st.sampled_from([None, (",", ":"), (" ,  ", " : ")]))
def test_encoded_values_decode_as_json_loads_does(
    value: Any, ascii_only: bool, separators: tuple[str, str] | None
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
    _assert_same_as_json(text.encode("utf-8", "surrogatepass"))


# JSON number texts, including many significant digits and large exponents.
_NUMBER_TEXT = st.from_regex(
    r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][-+]?[0-9]{1,4})?", fullmatch=True
)


@settings(max_examples=600, deadline=None)
@given(_NUMBER_TEXT)
@example("0.1000000000000000055511151231257827")
@example("2.2250738585072012e-308")
@example("1797693134862315807e290")
@example("123456789012345678")
@example("18446744073709551616")
@example("-9223372036854775809")
@example("-922337203685477580")
def test_number_texts_decode_as_json_loads_does(number: str) -> None:
    _assert_same_as_json(number.encode())
    _assert_same_as_json(b'{"n": [' + number.encode() + b"]}")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "\\u0061"]), _SCALARS), max_size=6))
def test_duplicate_keys_decode_as_json_loads_does(pairs: list[tuple[str, Any]]) -> None:
    members = ",".join(f'"{key}":{json.dumps(value)}' for key, value in pairs)
    _assert_same_as_json(("{" + members + "}").encode("utf-8", "surrogatepass"))


# Near-JSON byte soup: whatever json.loads makes of it, loads makes the same.
_PIECES = st.sampled_from(
    [b"{", b"}", b"[", b"]", b",", b":", b'"', b"\\", b"u", b"d800", b"0", b"1", b"9",
     b"-", b".", b"e", b"E", b"+", b" ", b"\n", b"\t", b"\x0c", b"\x00", b"\x1f", b"true",
     b"null", b"NaN", b"Infinity", b"a", b"\xc3\xa9", b"\xed\xa0\x80", b"\xff", b"\xef\xbb\xbf",
     b"12345678901234567890"]
)  # fmt: skip


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES, max_size=14).map(b"".join))
def test_byte_soup_decodes_or_fails_as_json_loads_does(body: bytes) -> None:
    _assert_same_as_json(body)
