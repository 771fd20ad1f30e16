"""Decoding a JSON body: orjson where it gives ``json.loads``' very value, ``json`` elsewhere.

One helper for both ends of the wire, the router reading an answer and the local
OpenRouter reading a request: decoding is the largest single piece of a request's own
CPU, and orjson's is the cheaper (docs/performance.md). A body orjson would read
differently goes to ``json``: one with a run of 19 ASCII digits (an integer beyond 64
bits, which orjson returns as a float), and any body orjson refuses (``NaN``, lone
surrogates, invalid UTF-8, a BOM, deep nesting...), for ``json``'s value or its exact
error. ``tests/test_json_decode.py`` holds the two equal, by type and float ``repr``.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from typing import Any, Final

import orjson

__all__ = ["loads"]

_decoder: Final = json.JSONDecoder()
_decode: Final = _decoder.decode
"""What ``json.loads`` decodes text with (its default decoder is built the same way)."""
# json's C scanner (what JSONDecoder.raw_decode calls); typeshed types its argument oddly.
_scan: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    _decoder  # type: ignore[arg-type]
)
_UTF8_STARTS: Final = frozenset((b"{", b"[", b" ", b"\n", b"\r", b"\t"))

_fast: Final = orjson.loads
_FastError: Final = orjson.JSONDecodeError
_DIGITS_AS_ZERO: Final = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN: Final = b"0" * 19
"""An integer orjson would turn into a float has at least this many digits: beyond
``2**64 - 1`` (20 digits) or below ``-2**63`` (19)."""


def loads(body: bytes) -> Any:
    """``json.loads(body)``: the same value, the same errors, a third of the time.

    orjson first, unless the body holds a run of 19 digits (see the module doc);
    on any orjson error, or for such a body, :func:`_loads_json` decodes it.
    """
    if _LONG_DIGIT_RUN not in body.translate(_DIGITS_AS_ZERO):
        try:
            return _fast(body)
        except _FastError:
            pass
    return _loads_json(body)


def _loads_json(body: bytes) -> Any:
    """``json.loads(body)``: the same value, the same errors, less work for UTF-8.

    ``json.loads`` takes UTF-16 or UTF-32 when the first two bytes hold a NUL and
    strips a UTF-8 BOM; a body starting with an ASCII brace or blank followed by
    another non-NUL byte is neither, so it decodes as UTF-8 exactly as
    ``json.loads`` would (same error handler, same decoder). Anything else goes
    through ``json.loads`` itself. A text that is one value with nothing around it
    (what both ends send) goes straight to json's C scanner; any other text, errors
    included, is decoded by ``decode`` as ``json.loads`` would, for the same value
    or the same error.
    """
    if body[:1] in _UTF8_STARTS and body[1:2] != b"\x00":
        text = body.decode("utf-8", "surrogatepass")
        try:
            value, end = _scan(text, 0)
        except (StopIteration, ValueError):
            return _decode(text)
        if end == len(text):
            return value
        return _decode(text)
    return json.loads(body)
