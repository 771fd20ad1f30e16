"""Keep-alive connections to one origin: at most ``limit`` open, reused only when clean."""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final, Protocol

import aiohappyeyeballs

from provider_router._http.h1.connection import H1Connection
from provider_router._http.h1.errors import H1ConnectError, H1ConnectTimeout, H1Error
from provider_router._http.h1.proxy import PROXY_GATEWAY_STATUSES, Proxy, open_tunnel, tunnel_reader
from provider_router._http.h1.resolver import Resolver
from provider_router._http.h1.response import H1Response

__all__ = [
    "HAPPY_EYEBALLS_DELAY",
    "KEEPALIVE_MARGIN",
    "KEEPALIVE_SECONDS",
    "REAP_INTERVAL",
    "H1Pool",
    "keep_alive_seconds",
]

HAPPY_EYEBALLS_DELAY: Final = 0.25
"""Seconds before the next address is tried while one is still connecting (RFC 8305's
recommended "Connection Attempt Delay", aiohttp's default)."""

KEEPALIVE_SECONDS: Final = 15.0
"""An idle connection older than this is closed instead of reused (aiohttp's 15 s)."""

KEEPALIVE_MARGIN: Final = 1.0
"""Seconds before the server's own ``Keep-Alive: timeout=N`` at which an idle connection
expires (half of ``N`` when ``N`` is under twice this): a request sent just as the server
closes its end is lost, and may have been billed."""

REAP_INTERVAL: Final = 0.1
"""The idle reaper (one loop timer a pool, armed for the next expiry) wakes at most this
often: an idle connection past its expiry is closed at most this late."""

_KEEP_ALIVE_TIMEOUT: Final = re.compile(r"(?:^|[,;\s])timeout\s*=\s*\"?(\d{1,9})")


def keep_alive_seconds(header: str | None) -> float:
    """How long a connection may idle, by the server's ``Keep-Alive`` header
    (``timeout=5, max=100``; RFC 2068 §19.7.1): :data:`KEEPALIVE_SECONDS` at most,
    :data:`KEEPALIVE_MARGIN` before the server's word; ``0`` for ``timeout=0``."""
    if header is None:
        return KEEPALIVE_SECONDS
    found = _KEEP_ALIVE_TIMEOUT.search(header.lower())
    if found is None:
        return KEEPALIVE_SECONDS
    server = float(found.group(1))
    return min(KEEPALIVE_SECONDS, max(server - KEEPALIVE_MARGIN, server / 2))


class _Exchange(Protocol):
    """Where :meth:`H1Pool.post` says whether the request still waits for a connection."""

    _unsent: bool


class H1Pool:
    """Keep-alive connections to one origin, at most ``limit`` open (``0``: no limit).

    Args:
        host, port: the origin.
        tls: whether to speak TLS (``https://``), verified against ``ssl_context``
            (default: the system's CAs).
        headers: sent with every request (``Host`` and ``Content-Length`` are added;
            values are sent UTF-8 encoded, as aiohttp sends them; the caller has
            refused line breaks in them).
        limit: most connections open at once; a request beyond waits for one.
        connect_timeout: seconds to open a connection (its lookup, the proxy's
            tunnel and the TLS handshake included).
        ssl_context: the TLS settings for ``tls`` (a private CA, a client certificate).
        proxy: the ``http://`` proxy to go through (:func:`~.proxy.proxy_for`), or
            ``None`` to connect directly.
    """

    __slots__ = (
        "_authority",
        "_connections",
        "_dial_host",
        "_dial_port",
        "_fixed",
        "_host",
        "_idle_stack",
        "_open",
        "_port",
        "_proxy",
        "_reaper",
        "_resolver",
        "_single_use",
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
        ssl_context: ssl.SSLContext | None = None,
        proxy: Proxy | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._proxy = proxy
        # Where the sockets go: the origin, or its proxy.
        self._dial_host = proxy.host if proxy is not None else host
        self._dial_port = proxy.port if proxy is not None else port
        self._resolver = (
            None if _is_ip(self._dial_host) else Resolver(self._dial_host, self._dial_port)
        )
        self._ssl: ssl.SSLContext | None = None
        if tls:
            self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
        bare = host.strip("[]")
        named = f"[{bare}]" if ":" in bare else bare
        self._authority = f"{named}:{port}"  # a CONNECT's target: the port always given
        default_port = 443 if tls else 80
        lines = [f"Host: {named if port == default_port else self._authority}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        # Plain HTTP through a proxy: each request carries the proxy's credentials
        # (through a tunnel only the CONNECT does, never the origin), and a connection
        # carries one request: proxies such as tinyproxy close the client's connection
        # after one answer without saying so, and a request sent as it closes may have
        # been billed. Through a tunnel, keep-alive is the origin's, as directly.
        self._single_use = proxy is not None and not tls
        if self._single_use and proxy is not None:
            lines += [f"{name}: {value}\r\n" for name, value in proxy.headers().items()]
            lines.append("Connection: close\r\n")
        self._fixed = "".join(lines).encode("utf-8")
        self.limit = limit
        self.connect_timeout = connect_timeout
        self.loop = asyncio.get_running_loop()
        self._idle_stack: list[H1Connection] = []
        self._connections: set[H1Connection] = set()
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._reaper: asyncio.TimerHandle | None = None
        self.closed = False

    def __repr__(self) -> str:
        via = f" via {self._proxy!r}" if self._proxy is not None else ""
        return f"H1Pool({self._authority}{via}, {self._open} open)"

    def request_head(self, target: str, content_type: str) -> bytes:
        """The bytes before a POST's ``Content-Length`` value (built once per path)."""
        if self._proxy is not None and self._ssl is None:
            target = f"http://{self._authority}{target}"  # absolute-form, for the proxy
        return (
            f"POST {target} HTTP/1.1\r\n".encode("latin-1")
            + self._fixed
            # Only what no bound is needed for (docs/client.md, "Connections").
            + b"Accept-Encoding: identity\r\n"
            + f"Content-Type: {content_type}\r\nContent-Length: ".encode("latin-1")
        )

    async def post(
        self,
        head: bytes,
        body: bytes,
        idle_limit: float | None = None,
        exchange: _Exchange | None = None,
    ) -> H1Response:
        """Send ``head`` (from :meth:`request_head`) with ``body``; the answer once its
        headers are in.

        ``idle_limit``: seconds without a byte (waiting for the headers or between two
        pieces of the body) after which the exchange fails with :class:`H1ReadTimeout`.
        ``exchange._unsent`` is True while the request waits for a connection (a slot
        under the limit, or one being opened): whatever ends that wait (a deadline's
        cancel included), nothing was written.

        Raises:
            H1ConnectError: no connection could be opened (nothing was sent).
            H1Error: the exchange failed after the request was written.
        """
        conn = self._take()  # an idle connection without a coroutine: the usual case
        if conn is None:
            if exchange is not None:
                exchange._unsent = True
            conn = await self._connection()
            if exchange is not None:
                exchange._unsent = False
        try:
            response = await conn.send(b"%b%d\r\n\r\n%b" % (head, len(body), body), idle_limit)
        except BaseException:
            conn.close()  # cancelled or failed mid-exchange: its state is unknown
            raise
        if self._single_use and response.status in PROXY_GATEWAY_STATUSES:
            # The proxy's word on its upstream, not the origin's: the origin may have the
            # request (and be generating it), so it is a transport failure after sending,
            # not an error status OpenRouter does not charge for.
            response.close()
            raise H1Error(
                f"the proxy {self._dial_host}:{self._dial_port} answered HTTP "
                f"{response.status}: no answer from the origin, which may have the request"
            )
        return response

    async def aclose(self) -> None:
        """Close every connection, idle or busy."""
        self.closed = True
        reaper = self._reaper
        if reaper is not None:
            self._reaper = None
            reaper.cancel()
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
            if self.loop.time() >= conn.expires:
                conn.close()  # the server may be closing it this very moment
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
            # aiohttp's wording, so either transport's error reads the same (a proxy
            # that does not answer is named as the host, as aiohttp names it).
            raise H1ConnectError(
                f"Cannot connect to host {self._dial_host}:{self._dial_port} ssl:default "
                f"[{exc.strerror or exc}]"
            ) from exc
        except BaseException:
            self._forget(conn)
            raise
        if conn.closed:  # closed during the handshake
            self._forget(conn)
            raise H1ConnectError(f"cannot connect to {self._host}:{self._port}: closed at once")
        if self.closed:  # aclose() ran while this one was opening: never send on it
            self._forget(conn)
            raise H1ConnectError("the connection pool is closed")
        self._connections.add(conn)
        return conn

    async def _open_socket(self, conn: H1Connection) -> None:
        """Connect ``conn`` to the origin: through the proxy's tunnel if there is one."""
        proxy = self._proxy
        if proxy is None or self._ssl is None:
            # Straight to the origin; or to a proxy for a plain-HTTP origin, which takes
            # each request with its absolute URL (request_head).
            hostname = self._host if self._ssl is not None else None
            await self._dial(lambda: conn, self._ssl, hostname)
            return
        protocol, reply = tunnel_reader(self.loop)
        transport = await self._dial(lambda: protocol, None, None)
        try:
            await open_tunnel(transport, reply, proxy, self._authority)
            # TLS to the origin inside the tunnel, verified against the origin's name.
            secure = await self.loop.start_tls(
                transport, conn, self._ssl, server_hostname=self._host
            )
        except OSError as exc:  # the handshake with the origin (a certificate, a reset)
            transport.close()
            # The origin named, as aiohttp names it for a TLS failure: the proxy did its part.
            raise H1ConnectError(
                f"Cannot connect to host {self._host}:{self._port} ssl:default through the "
                f"proxy {proxy.authority} [{exc.strerror or exc}]"
            ) from exc
        except BaseException:
            transport.close()
            raise
        if secure is None:  # the loop gave no transport: the tunnel closed under the handshake
            transport.close()
            raise H1ConnectError(f"the proxy {proxy.authority} closed the tunnel")
        conn.connection_made(secure)  # start_tls does not call it

    async def _dial(
        self,
        protocol: Callable[[], asyncio.Protocol],
        tls: ssl.SSLContext | None,
        hostname: str | None,
    ) -> asyncio.Transport:
        """A connection to the first address (of the origin, or of its proxy) that answers.

        Several addresses race as RFC 8305 says (aiohappyeyeballs, as aiohttp): the
        next one starts :data:`HAPPY_EYEBALLS_DELAY` after the one before, so an
        address that drops packets costs that delay, not the connect timeout.
        """
        resolver = self._resolver
        if resolver is None:
            # An IP address: nothing to look up or race (the loop connects without a lookup).
            transport, _ = await self.loop.create_connection(
                protocol, self._dial_host, self._dial_port, ssl=tls, server_hostname=hostname
            )
            return transport
        addresses = await resolver.addresses()
        infos = [
            (family, socket.SOCK_STREAM, proto, "", sockaddr)
            for family, proto, sockaddr in addresses
        ]
        try:
            sock = await aiohappyeyeballs.start_connection(
                infos, happy_eyeballs_delay=HAPPY_EYEBALLS_DELAY, interleave=1
            )
        except BaseException as exc:
            resolver.forget()  # no address took a connection (in time): ask again next time
            if isinstance(exc, RuntimeError):  # what uvloop may raise for a failed connect
                raise OSError(str(exc)) from exc
            raise
        try:
            transport, _ = await self.loop.create_connection(
                protocol, sock=sock, ssl=tls, server_hostname=hostname
            )
        except BaseException:
            sock.close()
            raise
        return transport

    def _forget(self, conn: H1Connection) -> None:
        if not conn.closed:
            conn._closed = True
            transport = conn._transport
            if transport is not None:
                transport.close()
        self._open -= 1
        self._wake()

    def _idle(self, conn: H1Connection, answer: H1Response | None = None) -> None:
        if self._single_use:
            conn.close()
            return
        keep = KEEPALIVE_SECONDS
        if answer is not None:
            keep = keep_alive_seconds(answer.headers.get("keep-alive"))
            if keep <= 0:
                conn.close()  # the server keeps no idle connection
                return
        now = self.loop.time()
        conn.expires = expires = now + keep
        self._idle_stack.append(conn)
        reaper = self._reaper
        # Armed for a later expiry (a server that keeps this one for less): earlier, then.
        if reaper is None or expires + REAP_INTERVAL < reaper.when():
            if reaper is not None:
                reaper.cancel()
            self._reaper = self.loop.call_at(max(expires, now + REAP_INTERVAL), self._reap)
        if self._waiters:
            self._wake()

    def _reap(self) -> None:
        """Close the idle connections past their expiry (a burst's connections do not
        stay open once it is over); wake again for the next one to expire."""
        self._reaper = None
        now = self.loop.time()
        stack = self._idle_stack
        kept = [conn for conn in stack if not conn.closed and now < conn.expires]
        for conn in stack:
            if not conn.closed and now >= conn.expires:
                conn.close()
        stack[:] = kept  # the same order: the most recently used on top
        if kept and not self.closed:
            due = min(conn.expires for conn in kept)
            self._reaper = self.loop.call_at(max(due, now + REAP_INTERVAL), self._reap)

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
