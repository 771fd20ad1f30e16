"""The lean HTTP/1.1 pool (``provider_router._http.h1``) over real sockets: what it reuses, what it
closes, how it waits for its limit, and how every way an exchange can end leaves it.

The answers themselves (framing, statuses, errors) are held to aiohttp's in
tests/_http/test_http_wire.py; these are the pool's own rules, each of which keeps a
late or foreign answer from being read as another request's.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from _polling import until
from _raw_http import exchange, head, pool_of, serve_fixture, whole  # noqa: F401  (the serve fixture)

from provider_router import (
    APIConnectionError,
    ConfigurationError,
    InvalidResponseError,
    RequestTimeout,
)
from provider_router._http.h1 import KEEPALIVE_SECONDS, H1ConnectError, H1Error, H1Pool
from provider_router._http.session import HttpClient, never_sent
from provider_router.testing import DEFAULT_TEST_KEY

CHAT = "/chat/completions"
ANSWER = {"id": "gen-1", "usage": {"cost": 0.25}}
BODY = json.dumps(ANSWER).encode()
PAYLOAD = b'{"model":"m"}'


def raw(data: bytes, *, close: bool = False) -> Callable[[int], Any]:
    """Every request answered with exactly ``data`` (then the connection closed if ``close``)."""

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(data)
            await writer.drain()
            if close:
                writer.close()

        return write

    return answer


async def test_sequential_requests_share_one_connection(serve) -> None:
    server = await serve(whole(BODY))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        for _ in range(5):
            assert await exchange(http) == ANSWER
    assert (server.connections, server.requests) == (1, 5)


async def test_the_limit_holds_and_every_waiter_gets_its_turn(serve) -> None:
    gate = asyncio.Event()
    busy = 0
    most = 0

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            nonlocal busy, most
            busy += 1
            most = max(most, busy)
            await gate.wait()
            busy -= 1
            writer.write(head(len(BODY)) + BODY)
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY, limit=2) as http:
        tasks = [asyncio.ensure_future(exchange(http)) for _ in range(6)]
        await until(lambda: server.requests >= 2)
        assert len(pool_of(http)._waiters) == 4  # the rest wait for a connection
        gate.set()
        assert await asyncio.gather(*tasks) == [ANSWER] * 6
    assert most == 2
    assert server.connections == 2


async def test_a_waiter_cancelled_in_the_queue_leaves_no_trace(serve) -> None:
    gate = asyncio.Event()

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            await gate.wait()
            writer.write(head(len(BODY)) + BODY)
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY, limit=1) as http:
        first = asyncio.ensure_future(exchange(http))
        await until(lambda: server.requests >= 1)
        queued = asyncio.ensure_future(exchange(http))
        await until(lambda: bool(pool_of(http)._waiters))
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert not pool_of(http)._waiters
        gate.set()
        assert await first == ANSWER
        assert await exchange(http) == ANSWER  # the freed turn is not lost
        assert len(http._deadlines) == 0


async def test_a_woken_waiter_that_is_cancelled_passes_its_turn_on(
    unused_tcp_port: int,
) -> None:
    pool = H1Pool("127.0.0.1", unused_tcp_port, tls=False, headers={}, limit=1, connect_timeout=1)
    pool._open = 1  # the one connection allowed is busy elsewhere
    first = asyncio.ensure_future(pool._connection())
    second = asyncio.ensure_future(pool._connection())
    await asyncio.sleep(0)
    assert len(pool._waiters) == 2
    pool._open = 0  # the busy connection closed ...
    pool._wake()  # ... and woke the first waiter, which is cancelled before it runs
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    # The second waiter got the turn: it tried to connect (nothing listens there).
    with pytest.raises(H1ConnectError, match="Cannot connect"):
        await second
    assert not pool._waiters
    assert pool._open == 0


async def test_a_request_cancelled_mid_exchange_closes_its_connection(serve) -> None:
    stalled = asyncio.Event()
    late = asyncio.Event()

    def answer(number: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            if number == 1:
                stalled.set()
                await late.wait()  # the late answer to the cancelled request
            writer.write(head(len(BODY)) + BODY)
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        task = asyncio.ensure_future(exchange(http))
        await stalled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await exchange(http) == ANSWER
        # Closed at the cancel, not left open until its late answer arrives.
        assert len(pool_of(http)._connections) == 1
        late.set()
    assert server.connections == 2, "the late answer's connection was never reused"


async def test_a_deadline_mid_exchange_closes_its_connection(serve) -> None:
    late = asyncio.Event()

    def answer(number: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            if number == 1:
                await late.wait()  # answered only after the client gave up
            writer.write(head(len(BODY)) + BODY)
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        with pytest.raises(RequestTimeout) as caught:
            await exchange(http, seconds=0.1)
        late.set()
        assert caught.value.request_sent is not False
        assert await exchange(http) == ANSWER
    assert server.connections == 2


async def test_an_idle_connection_past_keep_alive_is_not_reused(serve) -> None:
    server = await serve(whole(BODY))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER
        (idle,) = pool_of(http)._idle_stack
        idle.expires -= KEEPALIVE_SECONDS + 1  # aged past keep-alive
        assert await exchange(http) == ANSWER
        assert idle.closed
    assert server.connections == 2


async def test_bytes_after_the_answer_keep_the_connection_from_reuse(serve) -> None:
    extra = head(len(BODY)) + BODY + b"HTTP/1.1 200 OK\r\n"
    server = await serve(raw(extra))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER
        assert await exchange(http) == ANSWER
    assert server.connections == 2


@pytest.mark.parametrize(
    "stray", [head(len(BODY)) + BODY, b"HTTP/1.1 2"], ids=["a-whole-answer", "the-start-of-one"]
)
async def test_bytes_nobody_asked_for_keep_an_idle_connection_from_reuse(
    serve, stray: bytes
) -> None:
    writers: list[asyncio.StreamWriter] = []

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            writer.write(head(len(BODY)) + BODY)
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER
        (idle,) = pool_of(http)._idle_stack
        writers[0].write(stray)  # unsolicited, on the idle connection
        await writers[0].drain()
        await until(lambda: idle.closed or bool(idle._buffer))
        assert await exchange(http) == ANSWER  # on a new connection, not after those bytes
        assert idle.closed
    assert server.connections == 2


async def test_a_body_released_unread_closes_its_connection(serve) -> None:
    released = asyncio.Event()

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(len(BODY)) + BODY[:5])
            await writer.drain()
            await released.wait()
            writer.write(BODY[5:])
            await writer.drain()

        return write

    server = await serve(answer)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        response = await http.send(CHAT, PAYLOAD, request_timeout=5)
        assert not response.complete
        response.release()  # not read to its end: the rest must not reach the next request
        released.set()
        assert await exchange(http) == ANSWER
    assert server.connections == 2


async def test_closing_the_client_ends_a_request_in_flight(serve) -> None:
    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            await asyncio.Event().wait()  # never answers

        return write

    server = await serve(answer)
    http = HttpClient(server.url, DEFAULT_TEST_KEY)
    task = asyncio.ensure_future(exchange(http))
    await until(lambda: server.requests >= 1)
    await http.aclose()
    with pytest.raises(APIConnectionError) as caught:
        await task
    assert caught.value.request_sent is not False  # it was written: it may have been billed
    assert len(http._deadlines) == 0


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some servers send
    ],
)
async def test_a_compressed_body_is_decoded(serve, encoding: str, encode: Any) -> None:
    body = encode(BODY)
    answer = (
        f"HTTP/1.1 200 OK\r\nContent-Encoding: {encoding}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
    ) + body
    server = await serve(raw(answer))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\n{}", "encoding"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n{}", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n{}", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n", "chunk"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", "chunk"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{}\r\n0\r\n\r\n", "chunk"),
        (b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n{}", "status line"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", "101"),
        (b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000, "too long"),
    ],
)
async def test_a_malformed_answer_is_a_sent_connection_error(
    serve, answer: bytes, words: str
) -> None:
    server = await serve(raw(answer, close=True))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        with pytest.raises(APIConnectionError) as caught:
            await exchange(http)
        assert words in str(caught.value)
        assert caught.value.request_sent is not False
        assert str(caught.value).startswith(f"POST {server.url}{CHAT}: ")
        assert len(http._deadlines) == 0


async def test_a_204_has_no_body_and_is_named_as_empty(serve) -> None:
    server = await serve(raw(b"HTTP/1.1 204 No Content\r\n\r\n"))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        response = await http.send(CHAT, PAYLOAD, request_timeout=5)
        assert response.complete  # nothing to wait for after a 204's headers
        with pytest.raises(InvalidResponseError, match="empty body"):
            await response.json()
        response.release()
        assert len(http._deadlines) == 0


async def test_the_request_on_the_wire(serve) -> None:
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_head = await reader.readuntil(b"\r\n\r\n")
        body = await reader.readexactly(len(PAYLOAD))
        seen.append(request_head + body)
        writer.write(head(len(BODY)) + BODY)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with HttpClient(
            f"http://127.0.0.1:{port}/api/v1", DEFAULT_TEST_KEY, headers={"X-Title": "données"}
        ) as http:
            assert await exchange(http, payload=PAYLOAD) == ANSWER
    finally:
        server.close()
    (wire,) = seen
    request_head, _, body = wire.partition(b"\r\n\r\n")
    lines = request_head.split(b"\r\n")
    assert lines[0] == b"POST /api/v1/chat/completions HTTP/1.1"
    headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in lines[1:])}
    assert headers[b"host"] == f"127.0.0.1:{port}".encode()
    assert headers[b"authorization"] == f"Bearer {DEFAULT_TEST_KEY}".encode()
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(PAYLOAD)).encode()
    assert headers[b"x-title"] == "données".encode()  # UTF-8, as aiohttp sends it
    assert headers[b"accept-encoding"] == b"identity"  # only what needs no bound (#20)
    assert body == PAYLOAD


async def test_a_closed_client_refuses_to_send(serve) -> None:
    server = await serve(whole(BODY))
    http = HttpClient(server.url, DEFAULT_TEST_KEY)
    assert await exchange(http) == ANSWER
    await http.aclose()
    assert http.closed
    with pytest.raises(Exception, match="closed"):
        await exchange(http)


async def test_a_tls_handshake_that_fails_was_never_sent(serve) -> None:
    # A plain-text server behind an https:// URL: the handshake fails before any byte
    # of the request is written, so the request provably never reached the server.
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(1024))  # the TLS ClientHello
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with HttpClient(f"https://127.0.0.1:{port}", DEFAULT_TEST_KEY) as http:
            with pytest.raises(APIConnectionError) as caught:
                await exchange(http)
    finally:
        server.close()
    assert caught.value.request_sent is False
    assert caught.value.__cause__ is not None
    assert b"chat/completions" not in b"".join(received)


def test_errors_after_the_connection_opened_are_not_connect_errors() -> None:
    # never_sent() trusts the class: only H1ConnectError proves nothing was written.

    assert never_sent(H1ConnectError("refused"))
    assert not never_sent(H1Error("server disconnected before the answer"))


@pytest.mark.parametrize("key", ["sk-or-v1-abc\r\nX-Injected: 1", "sk-or-v1-abc\ndef", "sk\0x"])
def test_a_key_that_would_break_the_request_head_is_refused_unseen(key: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        HttpClient("http://127.0.0.1:9", key)
    assert "API key" in str(caught.value)
    assert key.strip() not in str(caught.value)
    assert "abc" not in repr(caught.value)


def test_a_header_that_would_break_the_request_head_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="'X-Title' header"):
        HttpClient("http://127.0.0.1:9", headers={"X-Title": "a\r\nb"})
