"""Keep-alive by the server's word, over real sockets: an idle connection expires before
the server's ``Keep-Alive: timeout=N`` (a request sent as the server closes may have been
billed), and the idle ones are reaped, so a burst's connections do not stay open."""

from __future__ import annotations

import asyncio
import json

import pytest
from _raw_http import exchange, pool_of
from _wire_server import Serve, answer, wire_fixture  # noqa: F401  (the wire fixture)

from provider_router._http.h1.pool import KEEPALIVE_SECONDS, keep_alive_seconds
from provider_router._http.session import HttpClient
from provider_router.testing import DEFAULT_TEST_KEY

CHAT = "/chat/completions"
ANSWER = {"id": "gen-1"}
BODY = json.dumps(ANSWER).encode()


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, KEEPALIVE_SECONDS),
        ("timeout=5, max=100", 4.0),  # Apache's default: a second's margin
        ("timeout=1", 0.5),  # short: half of it
        ("Timeout=2", 1.0),
        ("max=100, timeout=3", 2.0),
        ('timeout="4"', 3.0),
        ("timeout=600", KEEPALIVE_SECONDS),  # never longer than our own limit
        ("timeout=0", 0.0),  # keeps nothing idle
        ("max=5", KEEPALIVE_SECONDS),
        ("timeout=soon", KEEPALIVE_SECONDS),
        ("timeout=99999999999999", KEEPALIVE_SECONDS),
        ("", KEEPALIVE_SECONDS),
    ],
)
def test_the_keep_alive_header_is_read_with_a_margin(header: str | None, seconds: float) -> None:
    assert keep_alive_seconds(header) == seconds


async def test_an_idle_connection_is_closed_before_the_server_closes_it(wire: Serve) -> None:
    """The server closes idle connections after 1 s and says so: the client lets go first
    (kept for 15 s, the server's close could race the next request)."""
    server = await wire([answer(BODY, ("Keep-Alive", "timeout=1"))], idle_close=1.0)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER
        await server.until(lambda: server.closed == 1)
        assert server.idle_closed == 0, "the server had to close it: a request could race it"
        assert pool_of(http)._idle_stack == []
        assert await exchange(http) == ANSWER  # on a new connection
    assert server.connections == 2


async def test_within_the_servers_timeout_a_connection_is_reused(wire: Serve) -> None:
    server = await wire([answer(BODY, ("Keep-Alive", "timeout=5, max=100"))], idle_close=5.0)
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        for _ in range(3):
            assert await exchange(http) == ANSWER
    assert server.connections == 1


async def test_a_server_that_keeps_nothing_idle_is_never_reused(wire: Serve) -> None:
    server = await wire([answer(BODY, ("Keep-Alive", "timeout=0"))])
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        for _ in range(3):
            assert await exchange(http) == ANSWER
        assert pool_of(http)._idle_stack == []
    assert server.connections == 3


async def test_a_bursts_idle_connections_are_reaped(wire: Serve) -> None:
    """50 at once open 50 connections; once idle past the server's word they are closed by
    the client, though the server itself would keep them."""
    server = await wire([answer(BODY, ("Keep-Alive", "timeout=1"))])
    async with HttpClient(server.url, DEFAULT_TEST_KEY, limit=0) as http:
        assert await asyncio.gather(*(exchange(http) for _ in range(50))) == [ANSWER] * 50
        assert server.connections == 50
        pool = pool_of(http)
        await server.until(lambda: server.closed == 50)
        assert (pool._idle_stack, pool._connections, pool._open) == ([], set(), 0)
        assert pool._reaper is None  # nothing left to reap: no timer left armed
        assert await exchange(http) == ANSWER
    assert server.idle_closed == 0


async def test_a_shorter_keep_alive_is_reaped_on_time_behind_a_longer_one(wire: Serve) -> None:
    """The reaper, armed for a connection kept 15 s, is brought forward for one the server
    keeps 1 s: that one is closed by the client in time, the other stays for reuse."""
    server = await wire(
        [answer(BODY)],  # no Keep-Alive header: kept our own 15 s
        [0.05, answer(BODY, ("Keep-Alive", "timeout=1"))],  # idle after the first
    )
    async with HttpClient(server.url, DEFAULT_TEST_KEY, limit=0) as http:
        assert await asyncio.gather(exchange(http), exchange(http)) == [ANSWER] * 2
        await server.until(lambda: server.closed == 1)
        pool = pool_of(http)
        (kept,) = pool._idle_stack
        assert not kept.closed
        assert await exchange(http) == ANSWER  # on the connection kept
    assert server.connections == 2
    assert server.idle_closed == 0
