"""A completion answered past a limit is a cut answer: its money is held, never released (#20).

A Router against the local OpenRouter through a front server on loopback that passes
every GET through and answers the completion itself with a hostile body (the
generation id in its headers, as OpenRouter sends it). The request was written, so it
may have been billed: the reservation must stay held, with the id that lets
``/generation`` settle it later.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Callable
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from _router_helpers import MESSAGES, MakeRouter

from provider_router import APIConnectionError, MemoryLedger, RetryPolicy
from provider_router._http.h1.limits import MAX_BODY_BYTES, MAX_DECODED_BYTES

GENERATION = "gen-hostile-1"


def _gzip_bomb() -> bytes:
    """A multi-member gzip answer that inflates to twice MAX_DECODED_BYTES."""
    return zlib.compress(b"0" * (1 << 20), 9, 31) * (2 * MAX_DECODED_BYTES >> 20)


HOSTILE: dict[str, Callable[[], bytes]] = {
    "gzip-bomb": lambda: (
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"X-Generation-Id: " + GENERATION.encode() + b"\r\nContent-Length: %d\r\n\r\n%b"
        )
        % (len(_gzip_bomb()), _gzip_bomb())
    ),
    "content-length-past-the-limit": lambda: (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Generation-Id: "
        + GENERATION.encode()
        + b"\r\nContent-Length: %d\r\n\r\n{" % (MAX_BODY_BYTES + 1)
    ),
}


async def _front(sim_url: str, completion: bytes) -> AsyncIterator[str]:
    """A server that passes GETs on to ``sim_url`` and answers POSTs with ``completion``."""
    session = aiohttp.ClientSession()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                method, target, _ = line.split(" ")
                length = next(
                    (
                        int(f.split(":")[1])
                        for f in fields
                        if f.lower().startswith("content-length")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if method == "POST":
                    writer.write(completion)
                    await writer.drain()
                    await reader.read()  # until the client gives up the connection
                    return
                upstream = sim_url.split("/api/v1")[0] + target
                async with session.get(upstream, headers={"Authorization": "Bearer x"}) as got:
                    body = await got.read()
                    writer.write(
                        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (got.status, len(body), body)
                    )
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        server.close()
        await session.close()


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_an_answer_past_a_limit_keeps_its_reservation(
    openrouter_sim_factory: Any, make_router: MakeRouter, case: str
) -> None:
    sim = await openrouter_sim_factory()
    fronts = _front(sim.url, HOSTILE[case]())
    url = await fronts.__anext__()
    try:
        ledger = MemoryLedger(Decimal(1))
        front = SimpleNamespace(url=url)  # the Router talks to the front server
        router = await make_router(front, ledger=ledger, retry=RetryPolicy(max_attempts=1))
        with pytest.raises(APIConnectionError) as caught:
            await router.chat(MESSAGES, max_tokens=100)
        assert "MAX_" in str(caught.value)
        assert caught.value.request_sent
        await asyncio.gather(*router._billing._background)  # /generation knows no such id
        (held,) = router.unresolved
        assert held.generation_id == GENERATION  # OpenRouter can still say what it cost
        state = await ledger.snapshot()
        assert state.released == 0
        assert state.reserved == held.amount > 0
    finally:
        await fronts.aclose()
