"""The lean pool looks its origin up once and shares it (``provider_router._http.h1.resolver``),
over real sockets: many new connections, one query; a failed lookup is "never sent" and
never kept; an address that refuses gives way to the next."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from _raw_http import exchange, pool_of, serve_fixture, whole  # noqa: F401  (the serve fixture)

from provider_router import APIConnectionError
from provider_router._http.session import HttpClient
from provider_router.testing import DEFAULT_TEST_KEY

CHAT = "/chat/completions"
ANSWER = {"id": "gen-1"}
BODY = json.dumps(ANSWER).encode()


async def test_many_new_connections_share_one_lookup(serve) -> None:
    server = await serve(whole(BODY))
    url = server.url.replace("127.0.0.1", "localhost")
    async with HttpClient(url, DEFAULT_TEST_KEY, limit=0) as http:
        answers = await asyncio.gather(*(exchange(http) for _ in range(40)))
        assert answers == [ANSWER] * 40
        assert server.connections == 40  # all at once: each on a connection of its own
        resolver = pool_of(http)._resolver
        assert resolver is not None
        assert resolver.lookups == 1


async def test_a_name_that_does_not_resolve_was_never_sent_and_is_not_kept() -> None:
    async with HttpClient("http://nothing.invalid", DEFAULT_TEST_KEY, connect_timeout=2) as http:
        for attempt in (1, 2):
            with pytest.raises(APIConnectionError) as caught:
                await exchange(http)
            assert caught.value.request_sent is False
            resolver = pool_of(http)._resolver
            assert resolver is not None
            assert resolver.lookups == attempt  # asked again, not cached


async def test_a_refusing_address_gives_way_to_the_next(serve, unused_tcp_port: int) -> None:
    server = await serve(whole(BODY))
    port = int(server.url.rsplit(":", 1)[1])
    url = server.url.replace("127.0.0.1", "localhost")
    async with HttpClient(url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER  # the pool exists; its one connection idles
        pool = pool_of(http)
        for conn in list(pool._connections):
            conn.close()
        resolver = pool._resolver
        assert resolver is not None  # a name, not an IP address
        resolver._addresses = [
            (socket.AF_INET, 6, ("127.0.0.1", unused_tcp_port)),  # nothing listens here
            (socket.AF_INET, 6, ("127.0.0.1", port)),
        ]
        resolver._expires = asyncio.get_running_loop().time() + 60
        assert await exchange(http) == ANSWER
        assert resolver.lookups == 1  # the kept addresses were used, not a new query
    assert server.connections == 2


async def test_when_every_address_refuses_the_next_connection_looks_up_again(
    serve, unused_tcp_port: int
) -> None:
    server = await serve(whole(BODY))
    async with HttpClient(server.url.replace("127.0.0.1", "localhost"), DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER
        pool = pool_of(http)
        for conn in list(pool._connections):
            conn.close()
        resolver = pool._resolver
        assert resolver is not None  # a name, not an IP address
        resolver._addresses = [(socket.AF_INET, 6, ("127.0.0.1", unused_tcp_port))]
        resolver._expires = asyncio.get_running_loop().time() + 60
        with pytest.raises(APIConnectionError) as caught:
            await exchange(http)
        assert caught.value.request_sent is False
        assert await exchange(http) == ANSWER  # looked up again: the real address
        assert resolver.lookups == 2


async def test_an_ip_address_is_never_looked_up(serve) -> None:
    server = await serve(whole(BODY))
    async with HttpClient(server.url, DEFAULT_TEST_KEY) as http:
        assert await exchange(http) == ANSWER
        assert pool_of(http)._resolver is None
