"""Decoding a JSON body: ``json.loads(bytes)`` without its encoding sniffing on the usual body.

One helper for both ends of the wire: the router reading an answer (:mod:`_http`) and
the local OpenRouter reading a request (:mod:`provider_router.testing.chat`); each
decodes one body per request, so the few microseconds ``json.loads`` spends
detecting the encoding in Python count (docs/performance.md, #13 wave 3).
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from typing import Any, Final

__all__ = ["loads"]

_decoder: Final = json.JSONDecoder()
_decode: Final = _decoder.decode
"""What ``json.loads`` decodes text with (its default decoder is built the same way)."""
# json's C scanner (what JSONDecoder.raw_decode calls); typeshed types its argument oddly.
_scan: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    _decoder  # type: ignore[arg-type]
)
_UTF8_STARTS: Final = frozenset((b"{", b"[", b" ", b"\n", b"\r", b"\t"))


def loads(body: bytes) -> Any:
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
