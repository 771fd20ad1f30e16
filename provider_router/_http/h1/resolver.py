"""The origin's addresses: looked up once and shared, not once per new connection.

A router that opens 2,000 connections at its start would otherwise send 2,000
DNS queries at once, queued behind the event loop's few resolver threads
(seconds before the first request goes out). As aiohttp's connector does, the
answer is kept for :data:`DNS_TTL_SECONDS`; concurrent lookups share one query;
a failed lookup is never kept.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Final

__all__ = ["DNS_TTL_SECONDS", "Address", "Resolver"]

DNS_TTL_SECONDS: Final = 10.0
"""How long a lookup's addresses are reused (aiohttp's ``ttl_dns_cache``)."""

Address = tuple[int, int, Any]
"""``(family, proto, sockaddr)`` of one address to connect to."""


class Resolver:
    """The addresses of ``host:port`` for TCP, cached for :data:`DNS_TTL_SECONDS`."""

    __slots__ = ("_addresses", "_expires", "_host", "_lookup", "_port", "lookups")

    def __init__(self, host: str, port: int) -> None:
        self._host = host
        self._port = port
        self._addresses: list[Address] = []
        self._expires = 0.0
        self._lookup: asyncio.Future[list[Address]] | None = None
        self.lookups = 0  # how many queries were sent (for tests and diagnostics)

    async def addresses(self) -> list[Address]:
        """The addresses, in the resolver's order of preference.

        Raises:
            OSError: the name did not resolve (``socket.gaierror``).
        """
        loop = asyncio.get_running_loop()
        if self._addresses and loop.time() < self._expires:
            return self._addresses
        lookup = self._lookup
        if lookup is None or lookup.done():
            lookup = self._lookup = asyncio.ensure_future(self._query(loop))
            lookup.add_done_callback(_retrieve)
        # Shielded: a caller cancelled (its deadline) leaves the query to the others.
        return await asyncio.shield(lookup)

    def forget(self) -> None:
        """Drop the addresses (none of them took a connection): look up again next time."""
        self._addresses = []
        self._expires = 0.0

    async def _query(self, loop: asyncio.AbstractEventLoop) -> list[Address]:
        self.lookups += 1
        infos = await loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM)
        addresses: list[Address] = [
            (int(family), proto, sockaddr) for family, _, proto, _, sockaddr in infos
        ]
        if not addresses:
            raise socket.gaierror(f"no address for {self._host}")
        self._addresses = addresses
        self._expires = loop.time() + DNS_TTL_SECONDS
        return addresses


def _retrieve(lookup: asyncio.Future[list[Address]]) -> None:
    # A failure nobody awaited any more (every caller was cancelled) is not an error
    # to log: the next caller looks up again.
    if not lookup.cancelled():
        lookup.exception()
