"""Streams on the lean HTTP/1.1 pool (``provider_router._http.h1``), over real sockets: a reader
that falls behind pauses the socket and loses nothing, a trickling stream is never taken
for a silent one, a compressed stream is decoded piece by piece.

How a stream ends (deadlines, idle timeouts, cuts) is held to aiohttp's in
tests/_http/test_http_deadlines.py.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from _polling import until
from _raw_http import serve_fixture  # noqa: F401  (the serve fixture)

from provider_router import RequestTimeout
from provider_router._http.h1 import H1Pool
from provider_router._http.h1.response import PAUSE_BYTES
from provider_router._http.session import HttpClient
from provider_router.testing import DEFAULT_TEST_KEY

CHAT = "/chat/completions"
PAYLOAD = b'{"model":"m","stream":true}'
CHUNKED_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def event(number: int, pad: int = 0) -> bytes:
    return b"data: " + json.dumps({"n": number, "pad": "x" * pad}).encode() + b"\n\n"


def stream(
    pieces: list[bytes],
    *,
    pause: float = 0.0,
    head: bytes = b"",
    hold: asyncio.Event | None = None,
) -> Callable[[int], Any]:
    """A chunked SSE answer of ``pieces``, ``pause`` seconds apart (the idle timer is the
    loop's own: a trickle takes real time); ``hold``: after the first piece, wait for it."""

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(CHUNKED_HEAD + head + b"\r\n")
            for number, piece in enumerate(pieces):
                writer.write(chunk(piece))
                await writer.drain()
                if hold is not None and number == 0:
                    await hold.wait()
                if pause:
                    await asyncio.sleep(pause)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

        return write

    return answer


def pool_of(http: HttpClient) -> H1Pool:
    pool = http._pool
    assert pool is not None
    return pool


async def test_a_reader_that_falls_behind_pauses_the_socket_and_loses_nothing(serve) -> None:
    pieces = [event(n, pad=16_000) for n in range(300)]  # ~4.8 MB, 3x the pause mark
    assert sum(map(len, pieces)) > 3 * PAUSE_BYTES
    server = await serve(stream(pieces))
    seen: list[int] = []
    paused = 0
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        async with http.post(CHAT, PAYLOAD, request_timeout=30, idle_timeout=5) as response:
            (conn,) = pool_of(http)._connections
            await until(lambda: conn._paused)  # nobody reads yet: the socket is paused
            async for data in response.events():
                seen.append(json.loads(data)["n"])
                paused += conn._paused
                if len(seen) % 50 == 0:  # behind again, until the socket pauses (or all came)
                    await until(lambda: conn._paused or response._response.is_eof())
        assert seen == list(range(300))
        assert paused, "the reader fell behind at least once while reading"
        assert not conn._paused
        assert pool_of(http)._idle_stack == [conn]  # ended cleanly: reused
        async with http.post(CHAT, PAYLOAD, request_timeout=30) as response:
            assert len([d async for d in response.events()]) == 300
    assert server.connections == 1


async def test_a_whole_body_read_after_the_socket_paused_still_arrives(serve) -> None:
    body = json.dumps({"pad": "y" * (3 * PAUSE_BYTES)}).encode()

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            writer.write(body)
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        response = await http.send(CHAT, PAYLOAD, request_timeout=30)
        (conn,) = pool_of(http)._connections
        await until(lambda: conn._paused)
        assert len((await response.json())["pad"]) == 3 * PAUSE_BYTES
        response.release()
        assert not conn._paused


async def test_a_trickling_stream_is_not_silent(serve) -> None:
    # Eight events 50 ms apart, 0.15 s idle timeout: never 0.15 s without a byte.
    server = await serve(stream([event(n) for n in range(8)], pause=0.05))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        async with http.post(CHAT, PAYLOAD, request_timeout=30, idle_timeout=0.15) as response:
            assert len([d async for d in response.events()]) == 8
        (conn,) = pool_of(http)._idle_stack
        assert conn._watchdog is None  # no timer left behind an ended stream


async def test_a_stream_that_falls_silent_times_out_and_is_not_reused(serve) -> None:
    hold = asyncio.Event()  # the second event only after the client gave up
    server = await serve(stream([event(0), event(1)], hold=hold))
    seen: list[str] = []

    async def read(http: HttpClient) -> None:
        async with http.post(CHAT, PAYLOAD, request_timeout=30, idle_timeout=0.15) as r:
            async for data in r.events():
                seen.append(data)

    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        with pytest.raises(RequestTimeout) as caught:
            await read(http)
        hold.set()
        assert len(seen) == 1
        assert caught.value.request_sent is not False
        assert not pool_of(http)._connections  # closed, not kept for reuse
        assert len(http._deadlines) == 0


@pytest.mark.parametrize(
    ("encoding", "wbits"),
    [("gzip", 31), ("deflate", 15), ("deflate", -15)],  # -15: raw, as some servers send it
)
async def test_a_compressed_stream_is_decoded_piece_by_piece(
    serve, encoding: str, wbits: int
) -> None:
    plain = [event(n) for n in range(20)]
    compressor = zlib.compressobj(wbits=wbits)
    pieces = [compressor.compress(p) + compressor.flush(zlib.Z_SYNC_FLUSH) for p in plain]
    pieces.append(compressor.flush())
    header = f"Content-Encoding: {encoding}\r\n".encode()
    server = await serve(stream([p for p in pieces if p], head=header))
    async with (
        HttpClient(server.url, DEFAULT_TEST_KEY) as http,
        http.post(CHAT, PAYLOAD, request_timeout=30) as response,
    ):
        seen = [json.loads(d)["n"] async for d in response.events()]
    assert seen == list(range(20))
