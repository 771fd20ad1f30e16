"""Reading a POST answer's body (``PostResponse.json``) over a real socket.

A body already whole when the headers are parsed is taken from aiohttp's buffer
without ``ClientResponse.read()`` (three coroutines a request saved; docs/performance.md,
"Where a request's CPU goes"); a body still arriving, a cut one, or a session
with trace configs goes through ``read()`` as before. These tests hold both ways
equal: the same value, the same errors, the connection reused after either.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import aiohttp
import pytest
from _raw_http import head, serve_fixture, whole  # noqa: F401  (the serve fixture)

from provider_router import APIConnectionError, InvalidResponseError
from provider_router._http.session import HttpClient

BODY = (
    b'\n  {"id":"gen-1","provider":"Chutes","choices":[{"message":{"content":"hi"}}],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"cost":0.30000000000000004}}'
)


def _traced() -> tuple[aiohttp.TraceConfig, list[bytes]]:
    chunks: list[bytes] = []
    trace = aiohttp.TraceConfig()

    async def on_chunk(session: Any, context: Any, params: Any) -> None:
        chunks.append(params.chunk)

    trace.on_response_chunk_received.append(on_chunk)
    return trace, chunks


async def test_a_whole_body_reads_as_read_does_and_the_connection_is_reused(
    serve: Callable[[Callable[[int], Any]], Any],
) -> None:
    raw = await serve(whole(BODY))
    async with HttpClient(raw.url, limit=1) as http:
        values = []
        for _ in range(3):
            response = await http.send("/chat", b"{}")
            assert response.complete  # the shortcut's case
            values.append(await response.json())
            response.release()
    # The same value read() + decode gives, the exact cost pinned from the wire.
    expected = json.loads(BODY)
    expected["usage"]["cost"] = Decimal("0.30000000000000004")
    assert values == [expected] * 3
    assert type(values[0]["usage"]["cost"]) is Decimal
    assert (raw.requests, raw.connections) == (3, 1)  # released for reuse each time


async def test_a_traced_session_still_reads_through_read(
    serve: Callable[[Callable[[int], Any]], Any],
) -> None:
    """A session with trace configs gets its chunk signal: read() is kept for it."""
    raw = await serve(whole(BODY))
    trace, chunks = _traced()
    async with aiohttp.ClientSession(trace_configs=[trace]) as session:
        http = HttpClient(raw.url, session=session)
        response = await http.send("/chat", b"{}")
        assert response.complete
        traced = await response.json()
        response.release()
    assert chunks == [BODY]
    async with HttpClient(raw.url) as plain:
        response = await plain.send("/chat", b"{}")
        assert traced == await response.json()
        response.release()


async def test_a_body_still_arriving_is_awaited(
    serve: Callable[[Callable[[int], Any]], Any],
) -> None:
    go = asyncio.Event()

    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(len(BODY)) + BODY[:10])
            await writer.drain()
            await go.wait()
            writer.write(BODY[10:])
            await writer.drain()

        return write

    raw = await serve(answer)
    async with HttpClient(raw.url, limit=1) as http:
        response = await http.send("/chat", b"{}")
        assert not response.complete
        reading = asyncio.ensure_future(response.json())
        await asyncio.sleep(0)
        assert not reading.done()
        go.set()
        value = await reading
        response.release()
        assert value["choices"] == [{"message": {"content": "hi"}}]
        go.clear()
        response = await http.send("/chat", b"{}")  # the same connection again
        go.set()
        assert await response.json() == value
        response.release()
    assert raw.connections == 1


async def test_a_cut_body_raises_a_connection_error(
    serve: Callable[[Callable[[int], Any]], Any],
) -> None:
    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(len(BODY)) + BODY[:10])
            await writer.drain()
            writer.close()

        return write

    raw = await serve(answer)
    async with HttpClient(raw.url) as http:
        response = await http.send("/chat", b"{}")
        with pytest.raises(APIConnectionError):
            await response.json()
        response.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"", "empty body"), (b"not json", "not JSON"), (b"  \n ", "empty body")],
)
async def test_a_whole_body_that_is_not_json_says_what_came(
    serve: Callable[[Callable[[int], Any]], Any], body: bytes, message: str
) -> None:
    raw = await serve(whole(body))
    async with HttpClient(raw.url) as http:
        response = await http.send("/chat", b"{}")
        assert response.complete
        with pytest.raises(InvalidResponseError, match=message):
            await response.json()
        response.close()
