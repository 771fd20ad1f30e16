"""A lean HTTP/1.1 client for the per-request POST: keep-alive connections on asyncio protocols.

aiohttp's ``ClientSession.post`` costs ~120 µs of CPU a request (building a
``ClientRequest``, cookie and header merging, the connector's bookkeeping, a
payload writer, a response object with a stream reader); the bare exchange on
an :class:`asyncio.Protocol` costs a third of that (docs/performance.md, "#13
wave 6"). :class:`H1Pool` is that exchange, for the one request shape the
router sends thousands of times: a POST of a JSON body, answered by a whole
body (``Content-Length``, ``chunked`` or close-delimited). Streams, GETs and any
session the application hands us keep aiohttp (:mod:`provider_router._http`).

What it does, and why each rule keeps money safe:

* **Sent or not.** A request counts as sent from the moment its bytes are
  handed to the socket. Only a failure to open the connection (refused, DNS,
  TLS handshake, connect timeout) is :class:`H1ConnectError`, the one error
  that proves nothing reached the server; everything after is :class:`H1Error`.
* **Reuse only what is known clean.** A connection goes back to the pool only
  when its answer was read to the end, the server did not ask to close it, and
  nothing arrived after the answer. A cancel, a failure or an early release
  closes it: a late answer can never be read as the next request's.
* **Idle connections age out** after :data:`KEEPALIVE_SECONDS` (aiohttp's 15 s):
  a server may close an idle connection just as we reuse it.
* No ``Accept-Encoding`` is sent; a ``gzip``/``deflate`` body is decoded anyway.
  Redirects are not followed: a 3xx is an error status like any other.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Final

from multidict import CIMultiDict, CIMultiDictProxy

__all__ = ["KEEPALIVE_SECONDS", "H1ConnectError", "H1Error", "H1Pool", "H1Response"]

KEEPALIVE_SECONDS: Final = 15.0
"""An idle connection older than this is closed instead of reused."""

MAX_HEAD_BYTES: Final = 64 * 1024
"""A status line and headers longer than this are refused as malformed."""

_HEAD_END: Final = b"\r\n\r\n"
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,16}")
_HEADER: Final = re.compile(r"\r\n([^:\r\n]+):[ \t]*([^\r\n]*?)[ \t]*(?=\r\n|\Z)")

# Body framing of the answer being read.
_LENGTH: Final = 0  # Content-Length: ``_left`` bytes to come
_CHUNKED: Final = 1  # Transfer-Encoding: chunked
_UNTIL_CLOSE: Final = 2  # neither: the body ends when the server closes

# Where a chunked body is.
_SIZE: Final = 0  # at a chunk-size line
_DATA: Final = 1  # inside a chunk: ``_left`` bytes to come
_DATA_END: Final = 2  # after a chunk's data: its CRLF
_TRAILER: Final = 3  # after the last chunk: trailer lines up to an empty one


class H1Error(Exception):
    """The exchange failed after the request may have reached the server."""


class H1ConnectError(H1Error):
    """The connection could not be opened: the request was provably never sent."""


class H1ConnectTimeout(H1ConnectError, TimeoutError):
    """No connection within the connect timeout (never sent)."""


class H1Response:
    """One answer: status and headers on arrival, the body as it comes.

    It offers the part of aiohttp's ``ClientResponse`` the HTTP layer uses
    (``status``, ``headers``, ``content.is_eof()``, ``read()``, ``release()``,
    ``close()``), so :class:`provider_router._http.PostResponse` reads either.
    """

    __slots__ = (
        "_body",
        "_conn",
        "_encoding",
        "_eof",
        "_error",
        "_head",
        "_headers",
        "_reusable",
        "_waiter",
        "status",
    )

    def __init__(self, conn: H1Connection, status: int, head: str, reusable: bool) -> None:
        self._conn: H1Connection | None = conn
        self.status = status
        self._head = head
        self._headers: CIMultiDictProxy[str] | None = None
        self._body: list[bytes] = []
        self._eof = False
        self._error: H1Error | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._reusable = reusable
        self._encoding: str | None = None

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The answer's headers (case-insensitive), parsed on first use."""
        headers = self._headers
        if headers is None:
            headers = self._headers = CIMultiDictProxy(CIMultiDict(_HEADER.findall(self._head)))
        return headers

    @property
    def content(self) -> H1Response:
        """Itself: the body-reading calls aiohttp keeps on ``response.content``."""
        return self

    def is_eof(self) -> bool:
        """Whether the body has ended (whole, or cut short: see :meth:`exception`)."""
        return self._eof

    def exception(self) -> H1Error | None:
        """Why the body ended short, if it did."""
        return self._error

    def read_nowait(self) -> bytes:
        """The whole body, once :meth:`is_eof` (raises the failure that ended it short)."""
        if self._error is not None:
            raise self._error
        return self._decoded()

    async def read(self) -> bytes:
        """The whole body, waiting for it.

        Raises:
            H1Error: the connection broke before the body's end (a truncated body).
        """
        if not self._eof:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter
        return self.read_nowait()

    def release(self) -> None:
        """Done with the answer: its connection is reused if the answer ended cleanly
        (whether or not it was read, as aiohttp hands a connection back at the body's
        end), else closed."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            if self._eof and self._reusable and self._error is None:
                conn.recycle()
            else:
                conn.close()

    close = release
    """Done with the answer, maybe not read to its end: the same as :meth:`release`
    (an answer still arriving closes its connection either way)."""

    def _finish(self, error: H1Error | None = None) -> None:
        self._eof = True
        self._error = error
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _decoded(self) -> bytes:
        body = b"".join(self._body)
        encoding = self._encoding
        if encoding is None or not body:
            return body
        try:
            # 47: zlib or gzip header, detected; -15: a raw deflate stream.
            return zlib.decompress(body, 47 if encoding == "gzip" else 15)
        except zlib.error:
            if encoding == "deflate":
                try:
                    return zlib.decompress(body, -15)
                except zlib.error:
                    pass
            raise H1Error(f"the answer's {encoding} body could not be decoded") from None


class H1Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it arrives."""

    __slots__ = (
        "_buffer",
        "_chunk",
        "_closed",
        "_framing",
        "_left",
        "_pool",
        "_response",
        "_transport",
        "_waiter",
        "idle_since",
    )

    def __init__(self, pool: H1Pool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._waiter: asyncio.Future[H1Response] | None = None
        self._response: H1Response | None = None
        self._framing = _LENGTH
        self._chunk = _SIZE
        self._left = 0
        self._closed = False
        self.idle_since = 0.0

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by either side)."""
        return self._closed

    # --- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        try:
            if self._response is None:
                data = self._head(data)
            if self._response is not None and data:
                self._body(data)
        except H1Error as exc:
            self._fail(exc)

    def eof_received(self) -> None:
        self._closed = True  # never reused; the transport closes and connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._pool._lost(self)
        response = self._response
        if response is not None and not response._eof:
            if self._framing == _UNTIL_CLOSE and exc is None:
                response._finish()  # the body was close-delimited: this is its end
            else:
                response._finish(H1Error(_truncated(self._framing, exc)))
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                detail = f": {exc}" if exc is not None else ""
                waiter.set_exception(H1Error(f"server disconnected before the answer{detail}"))

    # --- one exchange -------------------------------------------------------------

    def send(self, request: bytes) -> asyncio.Future[H1Response]:
        """Write ``request``; the future resolves with the answer once its headers are in."""
        waiter = self._waiter = self._pool.loop.create_future()
        self._response = None
        try:
            self._transport.write(request)  # type: ignore[union-attr]
        except (OSError, RuntimeError) as exc:  # closed under us: part may have gone out
            raise H1Error(f"the connection failed while sending: {exc}") from exc
        return waiter

    def recycle(self) -> None:
        """Back to the pool (the answer was read to a clean end)."""
        self._response = None
        if self._closed or self._buffer:
            self.close()  # bytes after the answer: this connection cannot be trusted
        else:
            self._pool._idle(self)

    def close(self) -> None:
        """Close the connection (the pool forgets it when the close completes)."""
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(H1Error("the connection was closed before the answer came"))
        response = self._response
        self._response = None
        if response is not None and not response._eof:
            response._finish(H1Error("the connection was closed before the answer ended"))
        transport = self._transport
        if transport is not None and not self._closed:
            self._closed = True
            transport.close()
            self._pool._lost(self)

    def _fail(self, error: H1Error) -> None:
        waiter = self._waiter
        self._waiter = None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        response = self._response
        if response is not None and not response._eof:
            response._finish(error)
        self.close()

    # --- parsing ------------------------------------------------------------------

    def _head(self, data: bytes) -> bytes:
        """Parse a status line and headers from ``data``; what follows them is returned."""
        while True:
            end = data.find(_HEAD_END)
            if end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise H1Error("malformed answer: headers too long")
                self._buffer = data
                return b""
            head = data[:end]
            data = data[end + 4 :]
            if head[:7] != b"HTTP/1." or len(head) < 12 or head[12:13] not in (b"", b" ", b"\r"):
                raise H1Error(f"malformed answer: bad status line {_start(head)!r}")
            try:
                status = int(head[9:12])
            except ValueError:
                raise H1Error(f"malformed answer: bad status line {_start(head)!r}") from None
            if status < 100:
                raise H1Error(f"malformed answer: bad status line {_start(head)!r}")
            if status >= 200:
                break
            # 1xx: an interim answer; the real one follows.
        self._start_body(head, status)
        return data

    def _start_body(self, head: bytes, status: int) -> None:
        lower = head.lower()
        reusable = head[7:8] == b"1" and b"\r\nconnection: close" not in lower
        response = H1Response(self, status, head.decode("utf-8", "surrogateescape"), reusable)
        if b"\r\ncontent-encoding:" in lower:
            encoding = _value(lower, b"\r\ncontent-encoding:").decode("latin-1")
            if encoding not in ("", "identity"):
                if encoding not in ("gzip", "x-gzip", "deflate"):
                    raise H1Error(f"the answer's body has an unsupported encoding {encoding!r}")
                response._encoding = "deflate" if encoding == "deflate" else "gzip"
        self._response = response
        if status == 204 or status == 304:
            self._framing = _LENGTH
            self._left = 0
        elif b"\r\ntransfer-encoding:" in lower:
            codings = _value(lower, b"\r\ntransfer-encoding:")
            if codings.rsplit(b",", 1)[-1].strip() == b"chunked":
                self._framing = _CHUNKED
                self._chunk = _SIZE
            else:
                self._framing = _UNTIL_CLOSE
                response._reusable = False
        elif b"\r\ncontent-length:" in lower:
            length = _value(lower, b"\r\ncontent-length:")
            if not length.isdigit() or lower.count(b"\r\ncontent-length:") > 1:
                raise H1Error(f"malformed answer: Content-Length {length[:40]!r}")
            self._framing = _LENGTH
            self._left = int(length)
        else:
            self._framing = _UNTIL_CLOSE
            response._reusable = False
        if self._framing == _LENGTH and not self._left:
            response._finish()
        waiter = self._waiter
        self._waiter = None
        if waiter is None or waiter.done():
            # An answer to no request (or to one that was given up): never trust it.
            raise H1Error("an answer arrived that no request was waiting for")
        waiter.set_result(response)

    def _body(self, data: bytes) -> None:
        response = self._response
        assert response is not None  # called only while an answer is being read
        if response._eof:
            # Bytes after the answer's end: never reuse this connection.
            response._reusable = False
            return
        framing = self._framing
        if framing == _LENGTH:
            left = self._left
            if len(data) < left:
                response._body.append(data)
                self._left = left - len(data)
                return
            response._body.append(data[:left] if len(data) > left else data)
            self._left = 0
            if len(data) > left:
                response._reusable = False
            response._finish()
        elif framing == _UNTIL_CLOSE:
            response._body.append(data)
        else:
            self._chunked(response, data)

    def _chunked(self, response: H1Response, data: bytes) -> None:
        at = 0
        size = len(data)
        while at < size:
            state = self._chunk
            if state == _DATA:
                take = min(self._left, size - at)
                response._body.append(data[at : at + take])
                at += take
                self._left -= take
                if not self._left:
                    self._chunk = _DATA_END
                continue
            end = data.find(b"\r\n", at)
            if end < 0:
                if size - at > MAX_HEAD_BYTES:
                    raise H1Error("malformed answer: a chunk line too long")
                self._buffer = data[at:]
                return
            line = data[at:end]
            at = end + 2
            if state == _SIZE:
                digits = line.split(b";", 1)[0].strip()
                if _HEX.fullmatch(digits) is None:
                    raise H1Error(f"malformed answer: chunk size {digits[:20]!r}")
                chunk = int(digits, 16)
                if chunk:
                    self._chunk = _DATA
                    self._left = chunk
                else:
                    self._chunk = _TRAILER
            elif state == _DATA_END:
                if line:
                    raise H1Error("malformed answer: a chunk longer than its size")
                self._chunk = _SIZE
            elif not line:  # _TRAILER: the empty line ends the body
                if at < size:
                    response._reusable = False
                response._finish()
                return


class H1Pool:
    """Keep-alive connections to one origin, at most ``limit`` open (``0``: no limit).

    Args:
        url: the origin's URL (``http://`` or ``https://``; the path is ignored).
        headers: sent with every request (``Host`` and ``Content-Length`` are added).
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
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if tls else None
        default_port = 443 if tls else 80
        authority = host if port == default_port else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            authority = f"[{host}]" if port == default_port else f"[{host}]:{port}"
        lines = [f"Host: {authority}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        self._fixed = "".join(lines).encode("latin-1")
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
            + f"Content-Type: {content_type}\r\nContent-Length: ".encode("latin-1")
        )

    async def post(self, head: bytes, body: bytes) -> H1Response:
        """Send ``head`` (from :meth:`request_head`) with ``body``; the answer once its
        headers are in.

        Raises:
            H1ConnectError: no connection could be opened (nothing was sent).
            H1Error: the exchange failed after the request was written.
        """
        conn = self._take()
        if conn is None:
            conn = await self._connection()
        try:
            return await conn.send(b"%b%d\r\n\r\n%b" % (head, len(body), body))
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
                await self.loop.create_connection(
                    lambda: conn,
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
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
            self._open -= 1
            self._wake()
            raise H1ConnectError(f"cannot connect to {self._host}:{self._port}: closed at once")
        self._connections.add(conn)
        return conn

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


def _value(lower_head: bytes, name: bytes) -> bytes:
    start = lower_head.find(name) + len(name)
    end = lower_head.find(b"\r\n", start)
    return lower_head[start : end if end >= 0 else None].strip()


def _start(head: bytes) -> bytes:
    return head.split(b"\r\n", 1)[0][:40]


def _truncated(framing: int, exc: Exception | None) -> str:
    what = "chunked body" if framing == _CHUNKED else "body"
    detail = f": {exc}" if exc is not None else ""
    return f"the connection closed before the answer's {what} ended{detail}"
