"""Opening a connection on the lean pool, over real sockets: addresses raced as RFC 8305
says (aiohappyeyeballs), what a request that never got a connection is (never sent,
whatever ended its wait), and a pool closed while one was opening."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from _blackhole import blackhole_fixture  # noqa: F401  (the blackhole_port fixture)
from _polling import until
from _raw_http import exchange, pool_of
from _wire_server import HOLD, Serve, answer, wire_fixture  # noqa: F401  (the wire fixture)

from provider_router import APIConnectionError, RequestTimeout
from provider_router._http.h1.pool import HAPPY_EYEBALLS_DELAY
from provider_router._http.h1.resolver import Resolver
from provider_router._http.session import HttpClient
from provider_router.testing import DEFAULT_TEST_KEY
from provider_router.testing.loopback import answer_every_request

CHAT = "/chat/completions"
ANSWER = {"id": "gen-1"}
BODY = json.dumps(ANSWER).encode()


def addresses_of(http: HttpClient, *ports: int) -> Resolver:
    """Make the (looked-up) name of ``http``'s origin resolve to 127.0.0.1 at ``ports``,
    in that order, for the next minute."""
    resolver = pool_of(http)._resolver
    assert resolver is not None  # a name, not an IP address
    resolver._addresses = [(socket.AF_INET, 6, ("127.0.0.1", port)) for port in ports]
    resolver._expires = asyncio.get_running_loop().time() + 60
    return resolver


def connecting_to(port: int) -> int:
    """Sockets on this machine still connecting (``SYN_SENT``) to 127.0.0.1:``port``."""
    try:
        table = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        pytest.skip("no /proc/net/tcp to count connecting sockets by")
    remote = f"0100007F:{port:04X}"
    return sum(1 for row in table if row.split()[2] == remote and row.split()[3] == "02")


# --- Happy Eyeballs -------------------------------------------------------------------------


async def test_a_first_address_that_blackholes_gives_way_to_the_next(
    wire: Serve, blackhole_port: int
) -> None:
    server = await wire([answer(BODY)])
    url = server.url.replace("127.0.0.1", "localhost")
    # Tried one after the other, the blackholed address would take the whole connect
    # timeout and the request would fail; raced, the second starts 0.25 s later.
    assert HAPPY_EYEBALLS_DELAY * 4 < 2
    before = connecting_to(blackhole_port)  # the blackhole's own fillers
    async with HttpClient(url, DEFAULT_TEST_KEY, connect_timeout=2) as http:
        pool = http._lean()
        addresses_of(http, blackhole_port, server.port)
        assert await exchange(http) == ANSWER
        assert connecting_to(blackhole_port) == before  # the losing attempt's socket closed
        assert await exchange(http) == ANSWER  # the connection that won is kept and reused
        assert len(pool._connections) == 1
        assert pool._resolver is not None
        assert pool._resolver.lookups == 0
    assert server.connections == 1


async def test_when_every_address_blackholes_the_connect_timeout_ends_it_never_sent(
    blackhole_port: int,
) -> None:
    async with HttpClient(f"http://localhost:{blackhole_port}", DEFAULT_TEST_KEY) as http:
        http._lean().connect_timeout = 0.6
        resolver = addresses_of(http, blackhole_port, blackhole_port)
        with pytest.raises(RequestTimeout) as caught:
            await exchange(http)
        assert caught.value.request_sent is False
        assert "no connection within" in str(caught.value)
        assert resolver._addresses == []  # nothing took a connection: looked up again next time


# --- a deadline before the request was written: never sent -------------------------------


async def test_a_deadline_while_waiting_for_a_pool_slot_was_never_sent(wire: Serve) -> None:
    server = await wire([HOLD])  # the first request holds the one connection allowed
    async with HttpClient(server.url, DEFAULT_TEST_KEY, limit=1) as http:
        first = asyncio.ensure_future(exchange(http))
        await server.until(lambda: len(server.requests) == 1)
        with pytest.raises(RequestTimeout) as caught:
            await exchange(http, seconds=0.1)
        assert caught.value.request_sent is False
        assert "no connection within 0.1 s" in str(caught.value)
        assert not pool_of(http)._waiters
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert len(server.requests) == 1


async def test_a_streams_deadline_while_waiting_for_a_pool_slot_was_never_sent(
    wire: Serve,
) -> None:
    """The same through ``post()``, the context manager streams take."""
    server = await wire([HOLD])
    async with HttpClient(server.url, DEFAULT_TEST_KEY, limit=1) as http:
        first = asyncio.ensure_future(exchange(http))
        await server.until(lambda: len(server.requests) == 1)
        with pytest.raises(RequestTimeout) as caught:
            async with http.post(CHAT, b"{}", request_timeout=0.1, idle_timeout=5):
                pass
        assert caught.value.request_sent is False
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    assert len(server.requests) == 1


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["ip", "raced-name"])
async def test_a_deadline_while_connecting_was_never_sent(blackhole_port: int, host: str) -> None:
    url = f"http://{host}:{blackhole_port}"
    before = connecting_to(blackhole_port)
    async with HttpClient(url, DEFAULT_TEST_KEY, connect_timeout=30) as http:
        if host == "localhost":
            http._lean()
            addresses_of(http, blackhole_port, blackhole_port)  # two attempts cancelled
        with pytest.raises(RequestTimeout) as caught:
            await exchange(http, seconds=0.4)
        assert caught.value.request_sent is False
        assert connecting_to(blackhole_port) == before  # the cancelled attempts' sockets closed
        pool = pool_of(http)
        assert (pool._open, pool._connections) == (0, set())
        assert len(http._deadlines) == 0


async def test_a_deadline_after_the_request_was_written_is_still_sent(wire: Serve) -> None:
    server = await wire([HOLD])
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        with pytest.raises(RequestTimeout) as caught:
            await exchange(http, seconds=0.1)
        assert caught.value.request_sent is True
    assert len(server.requests) == 1


# --- aclose() while a connection opens ----------------------------------------------------


async def test_closing_while_a_connection_opens_sends_nothing_and_closes_the_socket(
    wire: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await wire([answer(BODY)])
    looked_up = asyncio.Event()
    gate = asyncio.Event()
    query = Resolver._query

    async def held_query(self: Resolver, loop: asyncio.AbstractEventLoop) -> Any:
        looked_up.set()
        await gate.wait()  # the lookup (so the connection) completes only after aclose()
        return await query(self, loop)

    monkeypatch.setattr(Resolver, "_query", held_query)
    http = HttpClient(server.url.replace("127.0.0.1", "localhost"), DEFAULT_TEST_KEY)
    task = asyncio.ensure_future(exchange(http))
    await looked_up.wait()
    await http.aclose()
    gate.set()
    with pytest.raises(APIConnectionError) as caught:
        await task
    assert caught.value.request_sent is False
    assert "closed" in str(caught.value)
    await until(lambda: server.connections == server.closed)
    assert server.requests == []  # nothing went out on the closed pool
    assert pool_of(http)._open == 0


def test_addresses_are_raced_under_uvloop_too(blackhole_port: int) -> None:
    """The CLI runs on uvloop, whose sockets and errors differ from asyncio's own."""
    uvloop = pytest.importorskip("uvloop")

    async def run() -> None:
        server = await asyncio.start_server(answer_every_request(BODY), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, HttpClient(f"http://localhost:{port}", DEFAULT_TEST_KEY) as http:
            http._lean().connect_timeout = 2
            addresses_of(http, blackhole_port, port)
            assert await exchange(http) == ANSWER
            with socket.socket() as probe:  # a port nobody listens on: refused
                probe.bind(("127.0.0.1", 0))
                refused = probe.getsockname()[1]
            for conn in list(pool_of(http)._connections):
                conn.close()
            addresses_of(http, refused)
            with pytest.raises(APIConnectionError) as caught:
                await exchange(http)
            assert caught.value.request_sent is False

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
