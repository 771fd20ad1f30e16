"""Hostile answers on the owned client's wire (#20): each ends in a clear error naming the
limit it broke, well within its deadline, with its money classified as the rules say.

Against the scripted raw server (tests/_wire_server.py), the owned client only:
these are the cases where the lean client's framing (llhttp through httptools) and
bounds (``provider_router/_http/h1/limits.py``) decide; aiohttp bounds some of them
differently. Memory and loop lag for the same answers are measured by
``python -m bench hostile`` (docs/performance.md), never here.
"""

from __future__ import annotations

import gzip
import zlib

import pytest
from _wire_server import (  # noqa: F401  (the clients and wire fixtures)
    ANSWER,
    CHAT,
    CHUNKED,
    CLOSE,
    GEN,
    HOLD,
    JSON,
    OK,
    PAYLOAD,
    Clients,
    Script,
    Serve,
    answer,
    bytewise,
    chunk,
    clients_fixture,
    exchange,
    head,
    parsed,
    wire_fixture,
)
from test_http_wire_stream import STREAM, event, stream

from provider_router import APIConnectionError, RateLimitError
from provider_router._http.h1.limits import (
    MAX_BODY_BYTES,
    MAX_DECODED_BYTES,
    MAX_FIELD_BYTES,
)
from provider_router._http.session import HttpClient
from provider_router._http.sse import MAX_EVENT_BYTES
from provider_router.client._billing import provably_free

DEADLINE = 10.0  # far beyond any case: each must fail at once, not at its deadline
GZIP = ("Content-Encoding", "gzip")


async def _failure(http: HttpClient) -> tuple[str, APIConnectionError]:
    """Which call raised (``send`` or ``json``) and the error, of one whole exchange."""
    phase = "send"
    try:
        response = await http.send(CHAT, PAYLOAD, request_timeout=DEADLINE)
        phase = "json"
        try:
            await response.json()
        finally:
            response.close()
    except APIConnectionError as exc:
        return phase, exc
    raise AssertionError("the answer was read as if it were whole")


def _bomb(size: int, byte: bytes = b"0") -> bytes:
    """``size`` bytes of ``byte`` gzip-compressed (a thousandth of that on the wire)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    piece = byte * (1 << 20)
    body = b"".join(packer.compress(piece) for _ in range(size >> 20))
    return body + packer.flush()


HUGE_CHUNK = head(headers=(JSON, CHUNKED, GEN)) + b"ffffffffffffffff\r\n"

# case: (script, which call raises, words of the message)
LIMITS: dict[str, tuple[Script, str, str]] = {
    "16k-spaces-in-a-value": (
        [head(headers=(JSON, GEN, ("X-Pad", "a" + " " * 16_000 + "b")), length=2) + b"{}"],
        "send",
        "MAX_FIELD_BYTES",
    ),
    "a-value-trickled-past-the-limit": (
        [b"HTTP/1.1 200 OK\r\nX-Pad: ", *([b"a" * 1000, 0.0] * (MAX_FIELD_BYTES // 1000 + 2))],
        "send",
        "MAX_FIELD_BYTES",
    ),
    "15000-header-lines": (
        [head(headers=((f"X-{i}", "v") for i in range(15_000)), length=2) + b"{}"],
        "send",
        "MAX_HEADERS",
    ),
    "1000-interim-103s": (
        [b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * 1000 + answer(ANSWER, GEN)],
        "send",
        "MAX_INTERIM_ANSWERS",
    ),
    "gzip-bomb": (
        [answer(_bomb(2 * MAX_DECODED_BYTES), GEN, GZIP)],
        "json",
        "MAX_DECODED_BYTES",
    ),
    "1.5GiB-content-length": (
        [head(headers=(JSON, GEN), length=3 << 29) + b'{"id":', HOLD],
        "json",
        "Content-Length too long",
    ),
    "2^64-1-chunk": (
        [HUGE_CHUNK, *([b"x" * (1 << 20)] * ((MAX_BODY_BYTES >> 20) + 2)), HOLD],
        "json",
        "MAX_BODY_BYTES",
    ),
    "brotli-200": (
        [answer(b"\x8b\x00\x80{}\x03", GEN, ("Content-Encoding", "br"))],
        "json",
        "unsupported encoding 'br'",
    ),
    "an-unknown-coding-is-not-echoed": (
        [answer(b"{}", GEN, ("Content-Encoding", "sk-or-v1-echoed"))],
        "json",
        "unsupported encoding '?'",
    ),
    "te-and-content-length": (
        [head(headers=(JSON, GEN, CHUNKED), length=len(ANSWER)) + chunk(ANSWER) + b"0\r\n\r\n"],
        "send",
        "Content-Length",
    ),
    "http-1.0-with-te": (
        [head(headers=(JSON, GEN, CHUNKED), version="HTTP/1.0") + chunk(ANSWER) + b"0\r\n\r\n"],
        "send",
        "HTTP/1.0",
    ),
    "http-1.9": ([answer(ANSWER, GEN).replace(b"HTTP/1.1", b"HTTP/1.9", 1)], "send", "version"),
    "http-1.1x200": ([answer(ANSWER, GEN).replace(b"1.1 ", b"1.1X", 1)], "send", "status line"),
    "nul-in-a-value": (
        [answer(ANSWER, GEN, ("X-Odd", "a\0b"))],
        "send",
        "NUL",
    ),
}


@pytest.mark.parametrize("case", list(LIMITS))
async def test_a_hostile_answer_is_a_clear_error_and_may_have_been_billed(
    wire: Serve, clients: Clients, case: str
) -> None:
    script, phase, words = LIMITS[case]
    server = await wire(script, [answer(ANSWER, GEN)])
    http = clients.connect("owned", server.url, limit=10)
    raised, error = await _failure(http)
    assert (raised, words in str(error)) == (phase, True), str(error)
    assert str(error).startswith(f"POST {http.url(CHAT)}: ")
    assert "echoed" not in str(error)  # a header's value is never repeated
    assert error.request_sent  # it was written: it may have been billed
    assert not provably_free(error, sent=True)  # so its reservation is kept
    assert len(http._deadlines) == 0
    assert await exchange(http) == OK  # a broken framing's connection was not reused


async def test_a_free_429_in_a_coding_we_do_not_decode_keeps_its_status(
    wire: Serve, clients: Clients
) -> None:
    """Its status reaches the retry logic (free, with its Retry-After), not "maybe billed"."""
    body = b"\x1b\x03\x00\xf8\xa5"  # a brotli body the client cannot read
    server = await wire(
        [answer(body, GEN, ("Content-Encoding", "br"), ("Retry-After", "7"), status="429 Slow")]
    )
    http = clients.connect("owned", server.url, limit=10)
    with pytest.raises(RateLimitError) as caught:
        await http.send(CHAT, PAYLOAD, request_timeout=DEADLINE)
    assert (caught.value.status, caught.value.retry_after) == (429, 7.0)
    assert provably_free(caught.value, sent=True)
    assert len(http._deadlines) == 0


def _gzip_chunked(*codings: tuple[str, str]) -> bytes:
    packed = gzip.compress(ANSWER)
    return (
        head(headers=(JSON, GEN, *codings))
        + chunk(packed[:10])
        + chunk(packed[10:])
        + (b"0\r\n\r\n")
    )


FRAMED: dict[str, Script] = {
    "gzip-chunked": [_gzip_chunked(("Transfer-Encoding", "gzip, chunked"))],
    "te-over-two-lines": [
        _gzip_chunked(("Transfer-Encoding", "gzip"), ("Transfer-Encoding", "chunked"))
    ],
    "multi-member-gzip": [
        answer(gzip.compress(ANSWER[:40]) + gzip.compress(ANSWER[40:]), GEN, GZIP)
    ],
    "a-head-in-tiny-writes": bytewise(answer(ANSWER, GEN, ("X-Pad", "p" * 2000))),
}


@pytest.mark.parametrize("case", list(FRAMED))
async def test_framing_by_rfc_9112(wire: Serve, clients: Clients, case: str) -> None:
    """Transfer codings before ``chunked`` are decoded, on one line or two; every gzip
    member is read; a trickled head is read (once: llhttp never re-scans it)."""
    server = await wire(FRAMED[case])
    http = clients.connect("owned", server.url, limit=10)
    outcome = await exchange(http, seconds=DEADLINE)
    assert (outcome.status, outcome.value, outcome.error) == (200, parsed(ANSWER), None)
    assert await exchange(http, seconds=DEADLINE) == outcome


async def test_an_obs_fold_continues_its_value(wire: Serve, clients: Clients) -> None:
    """RFC 9112 §5.2: the fold becomes a space; the generation id is not cut to ``gen-``."""
    raw = answer(ANSWER, GEN).replace(b"gen-wire-1", b"gen-\r\n wire-1", 1)
    server = await wire([raw])
    http = clients.connect("owned", server.url, limit=10)
    response = await http.send(CHAT, PAYLOAD, request_timeout=DEADLINE)
    assert response.headers["X-Generation-Id"] == "gen- wire-1"
    assert await response.json() == parsed(ANSWER)
    response.release()


async def test_te_with_content_length_closes_the_connection(wire: Serve, clients: Clients) -> None:
    """RFC 9112 §6.3: possible smuggling: an error, and the connection is never reused."""
    smuggled = head(headers=(JSON, GEN, CHUNKED), length=5) + chunk(ANSWER) + b"0\r\n\r\n"
    server = await wire([smuggled], [answer(ANSWER, GEN)])
    http = clients.connect("owned", server.url, limit=10)
    assert (await exchange(http)).error == "APIConnectionError"
    assert await exchange(http) == OK
    await server.until(lambda: server.closed >= 1)


async def _read_to_the_end(http: HttpClient) -> None:
    async with http.post(CHAT, PAYLOAD, request_timeout=DEADLINE) as response:
        async for _ in response.events():
            pass


STREAM_HEAD = head(headers=(STREAM, CHUNKED, GEN))


def _gzip_stream(*, finished: bool) -> Script:
    packer = zlib.compressobj(wbits=31)
    pieces = [
        packer.compress(event(f'{{"n":{n}}}')) + packer.flush(zlib.Z_SYNC_FLUSH) for n in (1, 2)
    ]
    if finished:
        pieces.append(packer.flush())
    return [head(headers=(STREAM, CHUNKED, GEN, GZIP)), *map(chunk, pieces), b"0\r\n\r\n"]


STREAMS: dict[str, tuple[Script, str]] = {
    "a-line-without-end": (
        [STREAM_HEAD, *([chunk(b"data: " + b"x" * (1 << 20))] * ((MAX_EVENT_BYTES >> 20) + 2))],
        "MAX_EVENT_BYTES",
    ),
    "an-event-without-end": (
        [STREAM_HEAD, *([chunk(b"data: " + b"x" * (1 << 20) + b"\n")] * 10)],
        "MAX_EVENT_BYTES",
    ),
    "a-gzip-bomb-of-one-line": (
        [head(headers=(STREAM, GEN, GZIP), length=None) + _bomb(4 * MAX_EVENT_BYTES, b"x"), CLOSE],
        "MAX_EVENT_BYTES",
    ),
    "a-gzip-stream-cut-short": (_gzip_stream(finished=False), "cut short"),
}


@pytest.mark.parametrize("case", list(STREAMS))
async def test_a_hostile_stream_is_cut_with_a_clear_error(
    wire: Serve, clients: Clients, case: str
) -> None:
    script, words = STREAMS[case]
    server = await wire(script, [answer(ANSWER, GEN)])
    http = clients.connect("owned", server.url, limit=10)
    with pytest.raises(APIConnectionError) as caught:
        await _read_to_the_end(http)
    assert words in str(caught.value), str(caught.value)
    assert caught.value.request_sent
    assert len(http._deadlines) == 0
    assert await exchange(http) == OK


async def test_a_whole_gzip_stream_still_reads(wire: Serve, clients: Clients) -> None:
    server = await wire(_gzip_stream(finished=True))
    http = clients.connect("owned", server.url, limit=10)
    outcome = await stream(http, seconds=DEADLINE)
    assert outcome.value == ('{"n":1}', '{"n":2}')


async def test_bytes_after_an_answer_that_ends_a_parsed_slice_keep_it_from_reuse(
    wire: Serve, clients: Clients
) -> None:
    """A long read is framed 8 KiB at a time: an answer ending exactly at a slice's end
    still has the bytes after it judged (a second answer nobody asked for)."""
    start = head(headers=(JSON, GEN), length=0)
    filler = 8192 - len(start) - len(b"X-Pad: \r\n")
    exact = start.replace(b"\r\n\r\n", b"\r\nX-Pad: " + b"p" * filler + b"\r\n\r\n")
    assert len(exact) == 8192
    server = await wire([exact + answer(ANSWER, GEN)], [answer(ANSWER, GEN)])
    http = clients.connect("owned", server.url, limit=10)
    assert (await exchange(http)).status == 200
    assert await exchange(http) == OK
    assert [r.connection for r in server.requests] == [1, 2]
