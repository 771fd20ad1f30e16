"""A raw HTTP/1.1 server on loopback for the HTTP layer's tests: it answers each
request as the test says (whole, cut, stalled, trickled), byte for byte."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from provider_router._http.h1 import H1Pool
from provider_router._http.session import HttpClient


@dataclass
class RawServer:
    """An HTTP/1.1 keep-alive server on loopback that answers each POST as told."""

    answer: Callable[[int], Any]  # request number -> coroutine writing the answer
    connections: int = 0
    requests: int = 0
    url: str = ""
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                await self.answer(self.requests)(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def head(length: int) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(length).encode() + b"\r\n\r\n"
    )


def whole(body: bytes) -> Callable[[int], Any]:
    def answer(_: int) -> Any:
        async def write(writer: asyncio.StreamWriter) -> None:
            writer.write(head(len(body)) + body)
            await writer.drain()

        return write

    return answer


@pytest.fixture(name="serve")
async def serve_fixture() -> AsyncIterator[Callable[[Callable[[int], Any]], Any]]:
    servers: list[asyncio.Server] = []
    raws: list[RawServer] = []

    async def start(answer: Callable[[int], Any]) -> RawServer:
        raw = RawServer(answer)
        server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        servers.append(server)
        raws.append(raw)
        raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return raw

    yield start
    for raw in raws:
        for writer in raw.writers:
            writer.close()
    for server in servers:
        server.close()
        await server.wait_closed()


CHAT = "/chat/completions"


async def exchange(http: HttpClient, seconds: float = 5.0, payload: bytes = b"{}") -> Any:
    """One completion on ``http``: sent, read whole and released (closed on an error)."""
    response = await http.send(CHAT, payload, request_timeout=seconds)
    try:
        body = await response.json()
    except BaseException:
        response.close()
        raise
    response.release()
    return body


def pool_of(http: HttpClient) -> H1Pool:
    """The lean pool of an owned client (created by its first request)."""
    pool = http._pool
    assert pool is not None, "the owned client sends through the lean pool"
    return pool
