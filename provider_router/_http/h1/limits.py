"""Every bound the lean HTTP/1.1 client puts on what a server sends, in one place.

llhttp (through ``httptools``) frames the answers but bounds nothing: a head may
be megabytes long, a chunk 2^64 - 1 bytes, a gzip body a thousand times its
size. Each limit below turns such an answer into an
:class:`~provider_router._http.h1.errors.H1Error` naming the limit (never a header's
value: it may echo the key), within the request's deadline and with memory held
to a few times the limit. Head limits are aiohttp's own (its ``max_field_size``,
``max_line_size`` and ``max_headers``), so either transport refuses the same heads.
An error after the request was written keeps ``request_sent`` (the money is held
for reconciliation, as for any cut answer).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DECODE_PIECE_BYTES",
    "MAX_BODY_BYTES",
    "MAX_DECODED_BYTES",
    "MAX_FIELD_BYTES",
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "MAX_INTERIM_ANSWERS",
    "too_big",
]

MAX_FIELD_BYTES: Final = 8190
"""The status line, and one header (or trailer) line, name and value together (aiohttp's
``max_line_size`` / ``max_field_size``)."""

MAX_HEADERS: Final = 128
"""Header lines in one head, and trailer lines after a chunked body (aiohttp's
``max_headers``)."""

MAX_HEAD_BYTES: Final = 64 * 1024
"""Everything before the answer's head ends (interim answers included), however it
trickles in."""

MAX_INTERIM_ANSWERS: Final = 16
"""1xx answers (``100 Continue``, ``103 Early Hints``) before the real one."""

MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""A body read whole (a JSON answer, an error's body), as it came.
The largest completion OpenRouter can send (262k tokens of text) is a few MB; a
stream is read piece by piece and has no total bound (its deadline ends it), only
:data:`~provider_router._http.sse.MAX_EVENT_BYTES` per event."""

MAX_DECODED_BYTES: Final = MAX_BODY_BYTES
"""A compressed body read whole, once decoded (we ask for none: ``Accept-Encoding:
identity``). It is decoded :data:`DECODE_PIECE_BYTES` a loop turn, so a bomb never
holds the loop, only this much memory."""

DECODE_PIECE_BYTES: Final = 256 * 1024
"""Most bytes a compressed body is decoded into in one loop turn (a streamed one: per
read; one read whole: until it is decoded); the rest of its input waits."""


def too_big(what: str, limit: int, name: str) -> str:
    """The message of an answer past a limit: what, the limit and its constant's name."""
    return f"malformed answer: {what} too long (over {limit:,} bytes: {name})"
