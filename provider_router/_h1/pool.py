"""Keep-alive connections to one origin: at most ``limit`` open, reused only when clean."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections import deque
from collections.abc import Mapping
from typing import Final

from provider_router._h1.connection import H1Connection
from provider_router._h1.errors import H1ConnectError, H1ConnectTimeout
from provider_router._h1.resolver import Resolver
from provider_router._h1.response import H1Response

__all__ = ["KEEPALIVE_SECONDS", "H1Pool"]

KEEPALIVE_SECONDS: Final = 15.0
"""An idle connection older than this is closed instead of reused."""


class H1Pool:
    """Keep-alive connections to one origin, at most ``limit`` open (``0``: no limit).

    Args:
        host, port: the origin.
        tls: whether to speak TLS (``https://``), verified against the system's CAs.
        headers: sent with every request (``Host`` and ``Content-Length`` are added;
            values are sent UTF-8 encoded, as aiohttp sends them; the caller has
            refused line breaks in them).
        limit: most connections open at once; a request beyond waits for one.
        connect_timeout: seconds to open a connection (and its TLS handshake).
    """

    __slots__ = (
        "_connections",
        "_fixed",
        "_host",
        "_idle_stack",
        "_open",
        "_port",
        "_resolver",
        "_ssl",
        "_waiters",
        "closed",
        "connect_timeout",
        "limit",
        "loop",
    )

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: bool,
        headers: Mapping[str, str],
        limit: int,
        connect_timeout: float,
    ) -> None:
        self._host = host
        self._port = port
        self._resolver = None if _is_ip(host) else Resolver(host, port)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if tls else None
        default_port = 443 if tls else 80
        authority = host if port == default_port else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            authority = f"[{host}]" if port == default_port else f"[{host}]:{port}"
        lines = [f"Host: {authority}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        self._fixed = "".join(lines).encode("utf-8")
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.loop = asyncio.get_running_loop()
        self._idle_stack: list[H1Connection] = []
        self._connections: set[H1Connection] = set()
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    def request_head(self, target: str, content_type: str) -> bytes:
        """The bytes before a POST's ``Content-Length`` value (built once per path)."""
        return (
            f"POST {target} HTTP/1.1\r\n".encode("latin-1")
            + self._fixed
            # Only what no bound is needed for (docs/client.md, "Connections").
            + b"Accept-Encoding: identity\r\n"
            + f"Content-Type: {content_type}\r\nContent-Length: ".encode("latin-1")
        )

    async def post(self, head: bytes, body: bytes, idle_limit: float | None = None) -> H1Response:
        """Send ``head`` (from :meth:`request_head`) with ``body``; the answer once its
        headers are in.

        ``idle_limit``: seconds without a byte (waiting for the headers or between two
        pieces of the body) after which the exchange fails with :class:`H1ReadTimeout`.

        Raises:
            H1ConnectError: no connection could be opened (nothing was sent).
            H1Error: the exchange failed after the request was written.
        """
        conn = self._take()  # an idle connection without a coroutine: the usual case
        if conn is None:
            conn = await self._connection()
        try:
            return await conn.send(b"%b%d\r\n\r\n%b" % (head, len(body), body), idle_limit)
        except BaseException:
            conn.close()  # cancelled or failed mid-exchange: its state is unknown
            raise

    async def aclose(self) -> None:
        """Close every connection, idle or busy."""
        self.closed = True
        for conn in list(self._connections):
            conn.close()
        self._idle_stack.clear()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _take(self) -> H1Connection | None:
        stack = self._idle_stack
        while stack:
            conn = stack.pop()
            if conn.closed or conn._buffer:  # closed, or sent bytes nobody asked for
                conn.close()
                continue
            if self.loop.time() - conn.idle_since > KEEPALIVE_SECONDS:
                conn.close()
                continue
            return conn
        return None

    async def _connection(self) -> H1Connection:
        while True:
            if self.closed:
                raise H1ConnectError("the connection pool is closed")
            conn = self._take()
            if conn is not None:
                return conn
            if not self.limit or self._open < self.limit:
                return await self._connect()
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken, then cancelled: pass the turn on
                else:
                    self._waiters.remove(waiter)
                raise

    async def _connect(self) -> H1Connection:
        self._open += 1
        conn = H1Connection(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await self._open_socket(conn)
        except TimeoutError:
            self._forget(conn)
            raise H1ConnectTimeout(
                f"cannot connect to {self._host}:{self._port} within {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            self._forget(conn)
            # aiohttp's wording, so either transport's error reads the same.
            raise H1ConnectError(
                f"Cannot connect to host {self._host}:{self._port} ssl:default "
                f"[{exc.strerror or exc}]"
            ) from exc
        except BaseException:
            self._forget(conn)
            raise
        if conn.closed:  # closed during the handshake
            self._forget(conn)
            raise H1ConnectError(f"cannot connect to {self._host}:{self._port}: closed at once")
        self._connections.add(conn)
        return conn

    async def _open_socket(self, conn: H1Connection) -> None:
        """Connect ``conn`` to the first address that answers (the lookup shared by all)."""
        resolver = self._resolver
        # An IP address has nothing to look up (and through the resolver costs more).
        addresses = (
            [(0, 0, (self._host, self._port))] if resolver is None else await resolver.addresses()
        )
        failure: OSError | None = None
        for family, proto, sockaddr in addresses:
            try:
                # A numeric host: the loop connects without a lookup of its own.
                await self.loop.create_connection(
                    lambda: conn,
                    sockaddr[0],
                    sockaddr[1],
                    family=family,
                    proto=proto,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
            except OSError as exc:
                failure = exc
                continue
            return
        if resolver is not None:
            resolver.forget()  # no address took a connection: ask again next time
        assert failure is not None  # addresses() never returns an empty list
        raise failure

    def _forget(self, conn: H1Connection) -> None:
        if not conn.closed:
            conn._closed = True
            transport = conn._transport
            if transport is not None:
                transport.close()
        self._open -= 1
        self._wake()

    def _idle(self, conn: H1Connection) -> None:
        conn.idle_since = self.loop.time()
        self._idle_stack.append(conn)
        if self._waiters:
            self._wake()

    def _lost(self, conn: H1Connection) -> None:
        if conn in self._connections:
            self._connections.discard(conn)
            self._open -= 1
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
